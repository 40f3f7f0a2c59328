//! JSON text of our own types, written by sonic-rs: its string escaping scans 16 bytes at a
//! time where serde_json looks up every byte, and a turn writes its texts several times (the
//! answer, the stored records on PostgreSQL). The output is serde_json's, byte for byte (a unit
//! test pins it); parsing stays with serde_json.

use serde::Serialize;

/// `value` as JSON text, into a buffer of `capacity` bytes to start with. Our types have string
/// keys and no fallible serializers, so this cannot fail; `null` stands in if it ever did. They
/// hold no `serde_json::value::RawValue` either, which only serde_json's own serializer writes
/// raw.
pub fn to_vec(value: &impl Serialize, capacity: usize) -> Vec<u8> {
    let mut text = Vec::with_capacity(capacity);
    if sonic_rs::to_writer(&mut text, value).is_err() {
        text.clear();
        text.extend_from_slice(b"null");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_is_what_serde_json_writes() {
        let texts = [
            "plain text, long enough to take the vectorised path of the escaper: 0123456789",
            "quotes \" and backslashes \\ and / slashes",
            "controls \u{0}\u{1}\u{8}\u{9}\u{a}\u{c}\u{d}\u{1f}\u{7f} in a row",
            "unicode é 漢字 🦀 and the separators \u{2028}\u{2029}",
            "",
        ];
        for text in texts {
            let value = serde_json::json!({
                "text": text,
                "nested": [{"k": text, "n": 12345678901234567u64, "m": -3, "b": true}, null],
                text: "as a key",
            });
            let expected = serde_json::to_vec(&value).expect("serializable");
            assert_eq!(
                String::from_utf8_lossy(&to_vec(&value, 0)),
                String::from_utf8_lossy(&expected)
            );
        }
    }
}
