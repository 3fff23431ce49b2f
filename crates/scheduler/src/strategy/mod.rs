//! Per-request strategies: how a request's sequences draw and what each keeps between steps.
//! Every strategy's state lives beside the sequence (in `SeqEntry`) or beside the request
//! (in `RequestState`), never inside `Sequence`. These modules know neither the scheduler nor
//! the pool; the step loop's side of each is in `scheduler/`.

pub(crate) mod beam;
pub(crate) mod draft_model;
pub(crate) mod sampling;
pub(crate) mod speculation;
