//! The page token of a conversation's messages, the same in both stores (so a token one store
//! issued resumes in the other after an export and import): the hex of the sequence number to
//! resume at, big-endian.

use super::{StoreError, StoreResult};

/// The token that resumes a conversation's messages at sequence number `seq`.
pub fn for_message(seq: u64) -> String {
    hex::encode(seq.to_be_bytes())
}

/// The sequence number a token resumes at; anything else is a token this server never issued.
pub fn message_seq(token: &str) -> StoreResult<u64> {
    hex::decode(token)
        .ok()
        .and_then(|bytes| <[u8; 8]>::try_from(bytes).ok())
        .map(u64::from_be_bytes)
        .ok_or(StoreError::BadPageToken)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_message_token_round_trips_and_nothing_else_parses() {
        for seq in [0, 1, 255, u64::MAX] {
            assert_eq!(super::message_seq(&super::for_message(seq)).ok(), Some(seq));
        }
        for bad in ["", "zz", "00", "000000000000000000"] {
            assert!(super::message_seq(bad).is_err(), "{bad}");
        }
    }
}
