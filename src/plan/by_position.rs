//! Tensors ordered by a position in the step, so that the dry run's scans after each op read
//! the few tensors near the current position instead of walking every tensor it knows (what
//! the engine's due index does for its prefetch scan; `engine::index`).

use std::collections::BTreeSet;

use crate::engine::TensorId;
use crate::fast_hash::FastMap as HashMap;

/// A set of tensors, each at one position (a tensor placed again moves).
#[derive(Debug, Default)]
pub(super) struct ByPosition {
    order: BTreeSet<(u64, TensorId)>,
    at: HashMap<TensorId, u64>,
}

impl ByPosition {
    /// Places `id` at `position`, wherever it was before.
    pub fn place(&mut self, id: TensorId, position: u64) {
        self.remove(id);
        self.order.insert((position, id));
        self.at.insert(id, position);
    }

    pub fn remove(&mut self, id: TensorId) {
        if let Some(position) = self.at.remove(&id) {
            self.order.remove(&(position, id));
        }
    }

    /// The tensors placed at or before `position`, soonest first.
    pub fn until(&self, position: u64) -> impl Iterator<Item = TensorId> + '_ {
        self.order
            .range(..=(position, TensorId::MAX))
            .map(|&(_, id)| id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tensor_is_found_up_to_its_position_and_moves_when_placed_again() {
        let mut set = ByPosition::default();
        set.place(7, 10);
        set.place(3, 4);
        set.place(5, 10);
        assert_eq!(set.until(3).count(), 0);
        assert_eq!(set.until(4).collect::<Vec<_>>(), vec![3]);
        assert_eq!(set.until(10).collect::<Vec<_>>(), vec![3, 5, 7]);
        set.place(3, 12);
        assert_eq!(
            set.until(10).collect::<Vec<_>>(),
            vec![5, 7],
            "moved from 4"
        );
        set.remove(5);
        set.remove(5);
        assert_eq!(set.until(u64::MAX).collect::<Vec<_>>(), vec![7, 3]);
    }
}
