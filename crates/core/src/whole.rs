//! Integer fields of request bodies and definitions: JSON Schema counts
//! `2.0` as the integer 2, and so does Composer (serde alone refuses it for
//! an `i32`). For `#[serde(deserialize_with = "…")]`.
use serde::de::{Deserializer, Error, Visitor};
use std::fmt;
use std::marker::PhantomData;

struct Whole<T>(PhantomData<T>);

impl<T: TryFrom<i64>> Visitor<'_> for Whole<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an integer")
    }

    fn visit_i64<E: Error>(self, v: i64) -> Result<T, E> {
        T::try_from(v).map_err(|_| E::custom(format!("{v} is out of range")))
    }

    fn visit_u64<E: Error>(self, v: u64) -> Result<T, E> {
        i64::try_from(v).map_err(|_| E::custom(format!("{v} is out of range"))).and_then(|v| self.visit_i64(v))
    }

    fn visit_f64<E: Error>(self, v: f64) -> Result<T, E> {
        if v.fract() != 0.0 || !(i64::MIN as f64..=i64::MAX as f64).contains(&v) {
            return Err(E::custom(format!("expected an integer, got {v}")));
        }
        self.visit_i64(v as i64)
    }
}

/// An integer, also when written `2.0`.
pub fn int<'de, D: Deserializer<'de>, T: TryFrom<i64>>(d: D) -> Result<T, D::Error> {
    d.deserialize_any(Whole(PhantomData))
}

/// An optional integer, also when written `2.0`; null is none.
pub fn opt_int<'de, D: Deserializer<'de>, T: TryFrom<i64>>(d: D) -> Result<Option<T>, D::Error> {
    struct Opt<T>(PhantomData<T>);
    impl<'de, T: TryFrom<i64>> Visitor<'de> for Opt<T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an integer or null")
        }
        fn visit_none<E: Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_unit<E: Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<T>, D::Error> {
            int(d).map(Some)
        }
    }
    d.deserialize_option(Opt(PhantomData))
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Deserialize, Debug, PartialEq)]
    struct Body {
        #[serde(deserialize_with = "super::int")]
        n: i32,
        #[serde(default, deserialize_with = "super::opt_int")]
        m: Option<u32>,
    }

    fn parse(s: &str) -> Result<Body, String> {
        serde_json::from_str(s).map_err(|e| e.to_string())
    }

    #[test]
    fn whole_floats_are_integers_and_the_rest_is_refused() {
        assert_eq!(parse(r#"{"n": 2.0, "m": 3.0}"#), Ok(Body { n: 2, m: Some(3) }));
        assert_eq!(parse(r#"{"n": -7}"#), Ok(Body { n: -7, m: None }));
        assert_eq!(parse(r#"{"n": 1, "m": null}"#), Ok(Body { n: 1, m: None }));
        for bad in [r#"{"n": 2.5}"#, r#"{"n": 1e300}"#, r#"{"n": 3000000000}"#, r#"{"n": 1, "m": -1}"#, r#"{"n": "1"}"#]
        {
            assert!(parse(bad).is_err(), "{bad} was accepted");
        }
    }
}
