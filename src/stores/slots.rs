//! Which Redis Cluster master holds a key, so the circuit breaker can be one per master.
//!
//! Redis Cluster cuts the key space into 16,384 hash slots, each owned by one master. A key's
//! slot is CRC16 (the XMODEM variant) of its hash tag, modulo 16,384, where the hash tag is
//! what stands between the first `{` and the next `}` when that is not empty, and the whole
//! key otherwise ([the cluster specification]). Which master owns which slot comes from
//! `CLUSTER SLOTS`; [`SlotMap`] holds its answer as one lookup per slot.
//!
//! [the cluster specification]: https://redis.io/docs/latest/operate/oss_and_stack/reference/cluster-spec/#hash-tags

use redis::Value;

/// Hash slots in a Redis Cluster.
pub const SLOT_COUNT: u16 = 16_384;

/// The hash slot of `key`, as Redis computes it (`CLUSTER KEYSLOT`).
pub fn key_slot(key: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(hash_tag(key)) % SLOT_COUNT
}

/// The part of `key` that is hashed: the first `{...}` when it is not empty, else the key.
fn hash_tag(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|&byte| byte == b'{') else {
        return key;
    };
    let rest = &key[open + 1..];
    match rest.iter().position(|&byte| byte == b'}') {
        Some(len) if len > 0 => &rest[..len],
        _ => key,
    }
}

/// A master as `CLUSTER SLOTS` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Master {
    /// `host:port`, as the cluster announces it: what the master is known by in logs.
    pub address: String,
    /// The first slot it owns: a command routed to this slot reaches this master, which is
    /// how its circuit breaker's probe gets there.
    pub first_slot: u16,
}

/// Which master owns each slot, from one `CLUSTER SLOTS` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotMap {
    /// The masters, each once, in the order the answer first names them.
    masters: Vec<Master>,
    /// By slot, an index into `masters`, or [`UNOWNED`] for a slot no master serves.
    owners: Box<[u16]>,
}

/// In [`SlotMap::owners`], a slot no master serves.
const UNOWNED: u16 = u16::MAX;

impl SlotMap {
    /// Read a `CLUSTER SLOTS` answer: an array of `[first, last, [host, port, id, ...],
    /// replicas...]`, one per range of slots. The error says what did not fit.
    pub fn from_cluster_slots(reply: &Value) -> Result<SlotMap, String> {
        let Value::Array(ranges) = reply else {
            return Err(format!("CLUSTER SLOTS answered {reply:?}, not an array"));
        };
        let mut masters: Vec<Master> = Vec::new();
        let mut owners = vec![UNOWNED; usize::from(SLOT_COUNT)].into_boxed_slice();
        for range in ranges {
            let (first, last, address) =
                slot_range(range).ok_or_else(|| format!("CLUSTER SLOTS answered a range of {range:?}"))?;
            // A master announced without an endpoint (`cluster-preferred-endpoint-type
            // unknown-endpoint`, or one being set up) cannot be told apart from another: its
            // slots stay with the whole store's breaker, and the rest of the map still counts.
            let Some(address) = address else {
                continue;
            };
            let index = match masters.iter().position(|master| master.address == address) {
                Some(index) => index,
                None => {
                    masters.push(Master {
                        address,
                        first_slot: first,
                    });
                    masters.len() - 1
                }
            };
            let master = &mut masters[index];
            master.first_slot = master.first_slot.min(first);
            // Each master owns a slot, so a sane answer names at most 16,384 of them.
            let index = u16::try_from(index)
                .ok()
                .filter(|&index| index < UNOWNED)
                .ok_or_else(|| "CLUSTER SLOTS named more masters than there are slots".to_owned())?;
            owners[usize::from(first)..=usize::from(last)].fill(index);
        }
        Ok(SlotMap { masters, owners })
    }

    /// The masters, each once.
    pub fn masters(&self) -> &[Master] {
        &self.masters
    }

    /// The index in [`masters`](Self::masters) of the owner of `slot`, if one serves it.
    pub fn owner(&self, slot: u16) -> Option<usize> {
        match self.owners.get(usize::from(slot)) {
            Some(&UNOWNED) | None => None,
            Some(&index) => Some(usize::from(index)),
        }
    }
}

/// `[first, last, [host, port, ...], ...]` as (first, last, "host:port"), slots checked; the
/// address is `None` when the host is `NULL`, empty or `?` (no endpoint announced).
fn slot_range(range: &Value) -> Option<(u16, u16, Option<String>)> {
    let Value::Array(fields) = range else {
        return None;
    };
    let [Value::Int(first), Value::Int(last), Value::Array(master), ..] = fields.as_slice() else {
        return None;
    };
    let first = u16::try_from(*first).ok().filter(|&slot| slot < SLOT_COUNT)?;
    let last = u16::try_from(*last)
        .ok()
        .filter(|&slot| first <= slot && slot < SLOT_COUNT)?;
    let [host, Value::Int(port), ..] = master.as_slice() else {
        return None;
    };
    let host = match host {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::SimpleString(text) => text.clone(),
        Value::Nil => String::new(),
        _ => return None,
    };
    let address = (!host.is_empty() && host != "?").then(|| format!("{host}:{port}"));
    Some((first, last, address))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_the_ones_redis_computes() {
        // CRC16/XMODEM's check value, and the examples of the cluster specification.
        assert_eq!(key_slot(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(
            key_slot(b"{user1000}.following"),
            key_slot(b"{user1000}.followers")
        );
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{bar"), key_slot(b"foo{bar"));
        assert_eq!(key_slot(b""), 0);
    }

    fn range(first: i64, last: i64, host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(first),
            Value::Int(last),
            Value::Array(vec![
                Value::BulkString(host.into()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ]),
            // A replica: not an owner.
            Value::Array(vec![Value::BulkString(b"10.0.0.9".to_vec()), Value::Int(7000)]),
        ])
    }

    #[test]
    fn a_map_names_each_master_once_with_its_slots() {
        let reply = Value::Array(vec![
            range(0, 5460, "10.0.0.1", 7000),
            range(10923, 16383, "10.0.0.3", 7000),
            range(5461, 10000, "10.0.0.2", 7000),
            range(10001, 10922, "10.0.0.1", 7000),
        ]);
        let map = SlotMap::from_cluster_slots(&reply).unwrap();
        let addresses: Vec<&str> = map.masters().iter().map(|m| m.address.as_str()).collect();
        assert_eq!(addresses, ["10.0.0.1:7000", "10.0.0.3:7000", "10.0.0.2:7000"]);
        assert_eq!(map.masters()[0].first_slot, 0);
        assert_eq!(map.masters()[1].first_slot, 10923);
        assert_eq!(map.owner(0), Some(0));
        assert_eq!(map.owner(5461), Some(2));
        assert_eq!(map.owner(10001), Some(0));
        assert_eq!(map.owner(16383), Some(1));
        assert_eq!(map.owner(SLOT_COUNT), None);
    }

    #[test]
    fn a_master_without_an_endpoint_leaves_its_slots_unowned_and_the_rest_mapped() {
        let mut unknown = range(100, 199, "", 7000);
        if let Value::Array(fields) = &mut unknown
            && let Value::Array(master) = &mut fields[2]
        {
            master[0] = Value::Nil;
        }
        let reply = Value::Array(vec![range(0, 99, "a", 1), unknown, range(200, 299, "?", 1)]);
        let map = SlotMap::from_cluster_slots(&reply).unwrap();
        assert_eq!(map.masters().len(), 1);
        assert_eq!(map.owner(50), Some(0));
        assert_eq!(map.owner(150), None);
        assert_eq!(map.owner(250), None);
    }

    #[test]
    fn uncovered_slots_have_no_owner_and_odd_answers_are_errors() {
        let map = SlotMap::from_cluster_slots(&Value::Array(vec![range(0, 99, "a", 1)])).unwrap();
        assert_eq!(map.owner(99), Some(0));
        assert_eq!(map.owner(100), None);
        for odd in [
            Value::Nil,
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![range(5, 4, "a", 1)]),
            Value::Array(vec![range(0, 16384, "a", 1)]),
            Value::Array(vec![range(-1, 4, "a", 1)]),
        ] {
            assert!(SlotMap::from_cluster_slots(&odd).is_err(), "{odd:?}");
        }
    }
}
