//! One file per Burn ops trait. Each is a forwarding table (see [`super::forward`]) plus the few
//! methods that cannot be plain forwards: metadata that must answer from the handle's cache and
//! reads that return futures.

mod activation;
mod bool;
mod float;
mod int;
mod module;
mod quantized;
mod transaction;
