//! The keys each section of `surety.toml` takes, read off the types that
//! read it: serde hands a struct's field names to the deserializer it
//! reads from, so a deserializer that keeps them and reads nothing names
//! every key a `deny_unknown_fields` section accepts. docs/configuration.md's
//! tables are held to these, both ways.

use serde::Deserialize;
use serde::de::{self, Visitor};

/// The names serde gives the deserializer for `T`'s fields.
pub fn fields_of<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    let mut keys = Keys(None);
    let _ = T::deserialize(&mut keys);
    keys.0.unwrap_or(&[])
}

/// A deserializer that keeps the field names of the struct asked of it
/// and gives no value.
struct Keys(Option<&'static [&'static str]>);

impl<'de> de::Deserializer<'de> for &mut Keys {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("only a struct's field names are read"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0 = Some(fields);
        Err(de::Error::custom("only a struct's field names are read"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

/// Each section this crate reads, as docs/configuration.md heads it, with
/// the keys it takes.
pub fn sections() -> Vec<(&'static str, &'static [&'static str])> {
    use surety_providers::config::{RawPrice, RawProviderConfig, RawTimeouts};
    vec![
        ("[providers.<id>]", fields_of::<RawProviderConfig>()),
        ("timeouts", fields_of::<RawTimeouts>()),
        ("price", fields_of::<RawPrice>()),
        ("[routes.<id>]", fields_of::<crate::RawRoute>()),
        ("[routes.<id>.shadow]", fields_of::<crate::RawShadow>()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sections_keys_are_its_fields_and_unknown_keys_stay_refused() {
        let shadow = fields_of::<crate::RawShadow>();
        assert_eq!(
            shadow,
            ["sampling", "hourly_budget", "max_concurrent", "timeout_ms"]
        );
        let route = fields_of::<crate::RawRoute>();
        assert!(
            route.contains(&"hedge_after_ms") && route.contains(&"shadow"),
            "{route:?}"
        );
        // The same type still refuses what is not among them.
        let unknown =
            toml::from_str::<crate::RawShadow>("sampling = 1.0\nhourly_budget = 1\nsamples = 2\n");
        assert!(unknown.is_err());
    }
}
