//! The delivery worker (filled in by the next step).
