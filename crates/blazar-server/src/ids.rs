//! Keystone-shaped ids for identities that do not come from Keystone.

/// Namespace of the deterministic ids below.
const ID_NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x5c4b0c3e_6b1f_4b57_9d7e_000000b1a2a7);

/// A Keystone-shaped id (32 hex digits) derived from a name, so a noauth server shows ids of
/// the shape clients and dashboards expect. The derivation (UUIDv5 of `kind:name`) is the one
/// the reference Blazar test bed uses, so transcripts of both compare equal.
pub fn keystone_like_id(kind: &str, name: &str) -> String {
    uuid::Uuid::new_v5(&ID_NAMESPACE, format!("{kind}:{name}").as_bytes())
        .simple()
        .to_string()
}
