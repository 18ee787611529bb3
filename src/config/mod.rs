//! Settings by their Kafka names: the broker settings of CONTRACT §4
//! ([`broker`]), Kafka's topic configs and the broker setting each one
//! inherits from ([`topic`]), and validation with errors that name the key.
//!
//! A broker setting comes from (lowest first) its default, the `--config`
//! TOML file, `--set KEY=VALUE`, then — for settings Kafka marks dynamic —
//! the cluster-wide dynamic broker configs in the metadata image
//! ([`Settings::layered`]). Unknown keys and bad values are rejected with a
//! [`SettingError`] naming the key; the CLI turns that into exit code 2.

pub mod broker;
pub mod topic;

use std::collections::BTreeMap;
use std::path::Path;

pub use broker::BROKER_SETTINGS;
pub use topic::{topic_config, topic_def, Effect, TopicConfigDef, TOPIC_CONFIGS};

/// What values a setting takes.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Int {
        min: i64,
        max: i64,
    },
    Double {
        min: f64,
        max: f64,
    },
    Bool,
    Choice(&'static [&'static str]),
    /// A comma-separated, non-empty list of these items.
    List(&'static [&'static str]),
    /// Kafka's throttled-replica list: empty, `*`, or `partition:broker,...`.
    ThrottledReplicas,
    /// Checked by a function that returns the normalized value or why not.
    Custom(fn(&str) -> Result<String, String>),
}

impl Kind {
    /// Whether IncrementalAlterConfigs may APPEND to or SUBTRACT from it.
    pub fn is_list(&self) -> bool {
        matches!(self, Kind::List(_) | Kind::ThrottledReplicas)
    }
}

/// One known setting.
#[derive(Debug, Clone, Copy)]
pub struct SettingDef {
    pub name: &'static str,
    /// `None`: unset unless given (for example no forced flush).
    pub default: Option<&'static str>,
    pub kind: Kind,
    pub doc: &'static str,
    /// Kafka lets it change at runtime (a dynamic broker config).
    pub dynamic: bool,
}

impl SettingDef {
    pub const fn dynamic(mut self) -> Self {
        self.dynamic = true;
        self
    }
}

pub(crate) const I32_MAX: i64 = i32::MAX as i64;

pub(crate) const fn int(min: i64, max: i64) -> Kind {
    Kind::Int { min, max }
}

pub(crate) const fn def(
    name: &'static str,
    default: Option<&'static str>,
    kind: Kind,
    doc: &'static str,
) -> SettingDef {
    SettingDef { name, default, kind, doc, dynamic: false }
}

/// A setting that is unknown or has a bad value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("setting `{key}`: {reason}")]
pub struct SettingError {
    pub key: String,
    pub reason: String,
}

fn err(key: &str, reason: impl Into<String>) -> SettingError {
    SettingError { key: key.to_string(), reason: reason.into() }
}

pub fn broker_def(name: &str) -> Option<&'static SettingDef> {
    BROKER_SETTINGS.iter().find(|d| d.name == name)
}

/// Checks `value` against `def`; returns it normalized (trimmed, lowercased bools).
pub fn validate(def: &SettingDef, key: &str, value: &str) -> Result<String, SettingError> {
    let v = value.trim();
    match def.kind {
        Kind::Int { min, max } => {
            let n: i64 = v.parse().map_err(|_| err(key, format!("must be an integer, got `{value}`")))?;
            if n < min || n > max {
                return Err(err(key, format!("must be between {min} and {max}, got {n}")));
            }
            Ok(n.to_string())
        }
        Kind::Double { min, max } => {
            let n: f64 = v.parse().map_err(|_| err(key, format!("must be a number, got `{value}`")))?;
            if !n.is_finite() || n < min || n > max {
                return Err(err(key, format!("must be between {min} and {max}, got `{value}`")));
            }
            Ok(v.to_string())
        }
        Kind::Bool => match v.to_ascii_lowercase().as_str() {
            "true" => Ok("true".into()),
            "false" => Ok("false".into()),
            _ => Err(err(key, format!("must be true or false, got `{value}`"))),
        },
        Kind::Choice(choices) => {
            if choices.contains(&v) {
                Ok(v.to_string())
            } else {
                Err(err(key, format!("must be one of {}, got `{value}`", choices.join(" | "))))
            }
        }
        Kind::List(choices) => {
            let items = topic::list_items(v);
            if items.is_empty() {
                return Err(err(key, format!("must list at least one of {}", choices.join(", "))));
            }
            if let Some(bad) = items.iter().find(|i| !choices.contains(&i.as_str())) {
                return Err(err(key, format!("`{bad}` is not one of {}", choices.join(", "))));
            }
            Ok(items.join(","))
        }
        Kind::ThrottledReplicas => {
            if v == "*" {
                return Ok(v.to_string());
            }
            let items = topic::list_items(v);
            let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            let bad = items.iter().find(|i| i.split_once(':').is_none_or(|(p, b)| !numeric(p) || !numeric(b)));
            match bad {
                Some(bad) => Err(err(key, format!("must be `*` or a list of partition:broker pairs, got `{bad}`"))),
                None => Ok(items.join(",")),
            }
        }
        Kind::Custom(check) => check(v).map_err(|reason| err(key, reason)),
    }
}

/// Why a dynamic broker config change is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DynamicError {
    #[error("unknown broker config `{0}`")]
    Unknown(String),
    /// Kafka: "Cannot update these configs dynamically".
    #[error("cannot update these configs dynamically: {0}")]
    ReadOnly(String),
    #[error(transparent)]
    Invalid(#[from] SettingError),
}

/// Validates a dynamic broker config change; returns the normalized value.
pub fn validate_dynamic(key: &str, value: Option<&str>) -> Result<Option<String>, DynamicError> {
    let def = broker_def(key).ok_or_else(|| DynamicError::Unknown(key.to_string()))?;
    if !def.dynamic {
        return Err(DynamicError::ReadOnly(key.to_string()));
    }
    value.map(|v| validate(def, key, v)).transpose().map_err(DynamicError::from)
}

/// A node's broker settings: defaults plus what the file and flags set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings {
    explicit: BTreeMap<String, String>,
}

impl Settings {
    /// Sets one key, validating it.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), SettingError> {
        let def = broker_def(key).ok_or_else(|| err(key, "unknown setting"))?;
        let v = validate(def, key, value)?;
        self.explicit.insert(key.to_string(), v);
        Ok(())
    }

    /// Parses `KEY=VALUE`.
    pub fn set_pair(&mut self, pair: &str) -> Result<(), SettingError> {
        let (k, v) = pair.split_once('=').ok_or_else(|| err(pair, "expected KEY=VALUE"))?;
        self.set(k.trim(), v)
    }

    /// Loads a TOML file of `key = value` pairs (nested tables join with dots).
    pub fn load_file(&mut self, path: &Path) -> Result<(), SettingError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| err("--config", format!("cannot read {shown}: {e}")))?;
        let table: toml::Table =
            text.parse().map_err(|e| err("--config", format!("{shown} is not valid TOML: {e}")))?;
        self.load_table("", &table)
    }

    fn load_table(&mut self, prefix: &str, table: &toml::Table) -> Result<(), SettingError> {
        for (k, v) in table {
            let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
            match v {
                toml::Value::Table(t) => self.load_table(&key, t)?,
                toml::Value::String(s) => self.set(&key, s)?,
                toml::Value::Integer(i) => self.set(&key, &i.to_string())?,
                toml::Value::Float(f) => self.set(&key, &f.to_string())?,
                toml::Value::Boolean(b) => self.set(&key, &b.to_string())?,
                other => return Err(err(&key, format!("unsupported value {other}"))),
            }
        }
        Ok(())
    }

    /// These settings with the cluster's dynamic broker configs (from the
    /// metadata image) over them. Only dynamic settings are taken; the
    /// controller validated them before they were written.
    pub fn layered(&self, dynamic: &BTreeMap<String, String>) -> Settings {
        let mut out = self.clone();
        for (k, v) in dynamic {
            if broker_def(k).is_some_and(|d| d.dynamic) {
                out.explicit.insert(k.clone(), v.clone());
            }
        }
        out
    }

    /// The settings broker `broker_id` runs with: these, then the
    /// cluster-wide dynamic configs, then that broker's own dynamic configs.
    pub fn for_broker(&self, image: &strom_raft::MetadataImage, broker_id: i32) -> Settings {
        let cluster = self.layered(&image.broker_configs);
        match image.per_broker_configs.get(&broker_id) {
            Some(own) => cluster.layered(own),
            None => cluster,
        }
    }

    /// Whether the file or a flag set `key` (else its default is in force).
    pub fn is_explicit(&self, key: &str) -> bool {
        self.explicit.contains_key(key)
    }

    /// The value in force, or `None` for an unset optional setting.
    pub fn get(&self, key: &str) -> Option<String> {
        self.explicit.get(key).cloned().or_else(|| broker_def(key).and_then(|d| d.default.map(str::to_string)))
    }

    /// An integer setting; the definitions guarantee it parses.
    pub fn int(&self, key: &str) -> Option<i64> {
        self.get(key).and_then(|v| v.parse().ok())
    }

    pub fn bool(&self, key: &str) -> bool {
        self.get(key).is_some_and(|v| v == "true")
    }

    /// An integer setting that has a default, as milliseconds or a count.
    pub fn u64(&self, key: &str) -> u64 {
        self.int(key).map_or(0, |v| v.max(0) as u64)
    }

    /// Every setting with its value in force (unset ones omitted).
    pub fn all(&self) -> BTreeMap<String, String> {
        BROKER_SETTINGS.iter().filter_map(|d| self.get(d.name).map(|v| (d.name.to_string(), v))).collect()
    }

    /// A topic's effective configs: its overrides over the broker settings
    /// (or the config's own default where it has no broker synonym).
    pub fn topic_effective(&self, overrides: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for config in TOPIC_CONFIGS {
            let inherited = || match config.synonym() {
                Some(broker) => self.get(broker),
                None => config.setting().and_then(|d| d.default.map(str::to_string)),
            };
            if let Some(v) = overrides.get(config.name).cloned().or_else(inherited) {
                out.insert(config.name.to_string(), v);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
