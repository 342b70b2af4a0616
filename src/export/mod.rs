//! Export: snapshots written back out. [`trim`] cuts a snapshot down to a window of its trace
//! and writes it as a pickle that PyTorch's viewer, Python's `pickle.load` and memsnap read.
//!
//! This stage reads the model and the replay; no other stage reads it.

pub mod trim;
