//! The one encoding of Strom's stored and sent values: bincode 2 over serde.
//!
//! Everything the quorum writes to sled or sends to a peer goes through
//! [`encode`] and [`decode`], so the format can change in one place. Decoding
//! never turns bad bytes into "nothing there": it returns a [`CodecError`].

use serde::de::DeserializeOwned;
use serde::Serialize;

/// A value could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("encode failed: {0}")]
    Encode(#[from] bincode::error::EncodeError),
    #[error("decode failed: {0}")]
    Decode(#[from] bincode::error::DecodeError),
    #[error("decode left {0} trailing bytes")]
    TrailingBytes(usize),
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard()
}

/// Encodes `value` into a fresh buffer.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError> {
    Ok(bincode::serde::encode_to_vec(value, config())?)
}

/// Decodes a whole buffer into a `T`; trailing bytes are an error.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    let (value, used) = bincode::serde::decode_from_slice(bytes, config())?;
    if used != bytes.len() {
        return Err(CodecError::TrailingBytes(bytes.len() - used));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_trailing_bytes() {
        let v = (7u64, "x".to_string(), Some(vec![1i32, 2]));
        let mut b = encode(&v).expect("encode");
        assert_eq!(decode::<(u64, String, Option<Vec<i32>>)>(&b).expect("decode"), v);
        b.push(0);
        assert!(matches!(decode::<(u64, String, Option<Vec<i32>>)>(&b), Err(CodecError::TrailingBytes(1))));
        assert!(decode::<(u64, String)>(&[0xff, 0xff]).is_err());
    }
}
