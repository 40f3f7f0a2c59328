//! Page tokens, the same in both stores. A conversation's messages: the hex of the sequence
//! number to resume at, big-endian (so a token one store issued resumes in the other after an
//! export and import). A listing (tasks, conversations): the hex of the order key of the item
//! it resumes after, 8 bytes of order, big-endian, then what breaks ties.

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

/// The token that resumes a listing after the item ordered by `order`, then `tail`.
pub fn for_listing(order: [u8; 8], tail: &[u8]) -> String {
    let mut key = order.to_vec();
    key.extend_from_slice(tail);
    hex::encode(key)
}

/// The order and tie-breaker of the item a listing token resumes after.
pub fn listing(token: &str) -> StoreResult<([u8; 8], Vec<u8>)> {
    let key = hex::decode(token).map_err(|_| StoreError::BadPageToken)?;
    let (order, tail) = key
        .split_first_chunk::<8>()
        .ok_or(StoreError::BadPageToken)?;
    Ok((*order, tail.to_vec()))
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

    #[test]
    fn a_listing_token_round_trips_and_a_short_one_is_refused() {
        let token = super::for_listing(7u64.to_be_bytes(), b"task");
        assert_eq!(
            super::listing(&token).ok(),
            Some((7u64.to_be_bytes(), b"task".to_vec()))
        );
        for bad in ["zz", "00000000000000"] {
            assert!(super::listing(bad).is_err(), "{bad}");
        }
    }
}
