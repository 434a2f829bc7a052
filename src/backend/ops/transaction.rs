//! Transactions: several reads behind one synchronisation, as `B` batches them.

use burn_backend::Backend;
use burn_backend::ExecutionError;
use burn_backend::ops::{TransactionOps, TransactionPrimitive, TransactionPrimitiveData};
use std::future::Future;

use crate::SpillBackend;

impl<B: Backend> TransactionOps<Self> for SpillBackend<B> {
    fn tr_execute(
        transaction: TransactionPrimitive<Self>,
    ) -> impl Future<Output = Result<TransactionPrimitiveData, ExecutionError>> + Send {
        let engine = transaction
            .read_floats
            .iter()
            .chain(&transaction.read_qfloats)
            .chain(&transaction.read_ints)
            .chain(&transaction.read_bools)
            .next()
            .map(|t| t.engine().clone());
        let inner = TransactionPrimitive::<B>::new(
            transaction
                .read_floats
                .into_iter()
                .map(|t| t.into_float())
                .collect(),
            transaction
                .read_qfloats
                .into_iter()
                .map(|t| t.into_quantized())
                .collect(),
            transaction
                .read_ints
                .into_iter()
                .map(|t| t.into_int())
                .collect(),
            transaction
                .read_bools
                .into_iter()
                .map(|t| t.into_bool())
                .collect(),
        );
        match engine {
            Some(engine) => crate::SpillTensor::<B>::ordered_read(&engine, move || {
                Box::pin(B::tr_execute(inner))
            }),
            None => Box::pin(B::tr_execute(inner)),
        }
    }
}
