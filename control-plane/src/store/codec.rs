//! The on-disk encoding of the embedded store's records: a stored key's record is
//! `mod_revision (u64 BE) | create_revision (u64 BE) | value`, a history record is
//! `kind (u8) | created (u8) | create_revision (u64 BE) | key length (u32 BE) | key | value`.
//! Length-checked on decode, so a damaged record is an error, never a panic.

use bytes::Bytes;

use super::{Event, EventKind, KeyValue, Revision, StoreError};

pub fn encode_kv(kv: &KeyValue) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + kv.value.len());
    out.extend_from_slice(&kv.mod_revision.0.to_be_bytes());
    out.extend_from_slice(&kv.create_revision.0.to_be_bytes());
    out.extend_from_slice(&kv.value);
    out
}

pub fn decode_kv(key: &str, raw: &[u8]) -> Result<KeyValue, StoreError> {
    let (head, value) = split(raw, 16)?;
    Ok(KeyValue {
        key: key.to_string(),
        value: Bytes::copy_from_slice(value),
        mod_revision: Revision(be_u64(&head[..8])),
        create_revision: Revision(be_u64(&head[8..])),
    })
}

pub fn encode_event(event: &Event) -> Vec<u8> {
    let key = event.kv.key.as_bytes();
    let mut out = Vec::with_capacity(14 + key.len() + event.kv.value.len());
    out.push(match event.kind {
        EventKind::Put => 0,
        EventKind::Delete => 1,
    });
    out.push(u8::from(event.created));
    out.extend_from_slice(&event.kv.create_revision.0.to_be_bytes());
    out.extend_from_slice(&(key.len() as u32).to_be_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(&event.kv.value);
    out
}

pub fn decode_event(revision: Revision, raw: &[u8]) -> Result<Event, StoreError> {
    let (head, rest) = split(raw, 14)?;
    let kind = match head[0] {
        0 => EventKind::Put,
        1 => EventKind::Delete,
        other => return Err(corrupt(format!("event kind {other}"))),
    };
    let create_revision = Revision(be_u64(&head[2..10]));
    let key_len = u32::from_be_bytes([head[10], head[11], head[12], head[13]]) as usize;
    let (key, value) = split(rest, key_len)?;
    let key = std::str::from_utf8(key)
        .map_err(|e| corrupt(format!("key: {e}")))?
        .to_string();
    Ok(Event {
        kind,
        created: head[1] == 1,
        kv: KeyValue {
            key,
            value: Bytes::copy_from_slice(value),
            create_revision,
            mod_revision: revision,
        },
    })
}

fn split(raw: &[u8], at: usize) -> Result<(&[u8], &[u8]), StoreError> {
    if raw.len() < at {
        return Err(corrupt(format!(
            "record of {} bytes, expected at least {at}",
            raw.len()
        )));
    }
    Ok(raw.split_at(at))
}

fn be_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

fn corrupt(what: String) -> StoreError {
    StoreError::Backend(format!("corrupt record: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_round_trips() {
        let e = Event {
            kind: EventKind::Delete,
            created: false,
            kv: KeyValue {
                key: "/core/pods/default/web".into(),
                value: Bytes::from_static(b"{\"a\":1}"),
                create_revision: Revision(3),
                mod_revision: Revision(9),
            },
        };
        assert_eq!(decode_event(Revision(9), &encode_event(&e)).unwrap(), e);
    }

    #[test]
    fn truncated_records_are_errors() {
        assert!(decode_kv("k", &[1, 2]).is_err());
        assert!(decode_event(Revision(1), &[0; 10]).is_err());
        let mut raw = encode_event(&Event {
            kind: EventKind::Put,
            created: true,
            kv: KeyValue {
                key: "k".into(),
                value: Bytes::new(),
                create_revision: Revision(1),
                mod_revision: Revision(1),
            },
        });
        raw[13] = 200; // key length beyond the record
        assert!(decode_event(Revision(1), &raw).is_err());
    }
}
