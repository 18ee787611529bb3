//! Kafka listeners by Kafka's settings: `listeners`, `advertised.listeners`,
//! `listener.security.protocol.map` and `inter.broker.listener.name`.
//!
//! A listener is a name (`PLAINTEXT`, `CLIENTS`, ...), the security protocol
//! its name maps to, the address it binds, and the address Metadata
//! advertises for it. Without `listeners`, a node has the one PLAINTEXT
//! listener of `--kafka`, as before.

use crate::config::Settings;

/// Kafka's four security protocols.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "PLAINTEXT" => Some(Self::Plaintext),
            "SSL" => Some(Self::Ssl),
            "SASL_PLAINTEXT" => Some(Self::SaslPlaintext),
            "SASL_SSL" => Some(Self::SaslSsl),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Plaintext => "PLAINTEXT",
            Self::Ssl => "SSL",
            Self::SaslPlaintext => "SASL_PLAINTEXT",
            Self::SaslSsl => "SASL_SSL",
        }
    }

    pub fn uses_tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }

    pub fn uses_sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }
}

/// One Kafka listener of this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub name: String,
    pub protocol: SecurityProtocol,
    /// What it binds, `HOST:PORT`.
    pub bind: String,
    /// What Metadata tells clients that came in on it, `HOST:PORT`.
    pub advertised: String,
}

/// Checks a `listeners` or `advertised.listeners` value: `NAME://HOST:PORT`,
/// comma-separated, names unique. An empty host (`PLAINTEXT://:9092`) binds
/// every interface, as in Kafka.
pub fn parse_endpoints(value: &str) -> Result<Vec<(String, String)>, String> {
    let mut out: Vec<(String, String)> = Vec::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, addr) = item
            .split_once("://")
            .ok_or_else(|| format!("`{item}` is not NAME://HOST:PORT (e.g. SASL_SSL://0.0.0.0:9094)"))?;
        check_name(name)?;
        let (host, port) = addr.rsplit_once(':').ok_or_else(|| format!("`{item}` has no port"))?;
        if port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(format!("`{item}`: the port must be 1 to 65535"));
        }
        let host = if host.is_empty() { "0.0.0.0" } else { host };
        if out.iter().any(|(n, _)| n == name) {
            return Err(format!("listener name {name} appears twice"));
        }
        out.push((name.to_string(), format!("{host}:{port}")));
    }
    if out.is_empty() {
        return Err("no listener given".into());
    }
    Ok(out)
}

/// Checks a `listener.security.protocol.map` value: `NAME:PROTOCOL,...`.
pub fn parse_protocol_map(value: &str) -> Result<Vec<(String, SecurityProtocol)>, String> {
    let mut out: Vec<(String, SecurityProtocol)> = Vec::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, protocol) = item.split_once(':').ok_or_else(|| format!("`{item}` is not NAME:PROTOCOL"))?;
        check_name(name)?;
        let protocol = SecurityProtocol::parse(protocol).ok_or_else(|| {
            format!("`{protocol}` is not a security protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)")
        })?;
        if out.iter().any(|(n, _)| n == name) {
            return Err(format!("listener name {name} is mapped twice"));
        }
        out.push((name.to_string(), protocol));
    }
    Ok(out)
}

fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        return Err(format!("`{name}` is not a listener name (letters, digits, _ and -)"));
    }
    Ok(())
}

/// The setting validators (the values' syntax; [`resolve`] checks the rest).
pub fn validate_endpoints(value: &str) -> Result<String, String> {
    parse_endpoints(value).map(|_| value.trim().to_string())
}

pub fn validate_protocol_map(value: &str) -> Result<String, String> {
    parse_protocol_map(value).map(|_| value.trim().to_string())
}

/// This node's Kafka listeners: from `listeners` when set, else the one
/// PLAINTEXT listener of `--kafka` (default `127.0.0.1:9092`) advertised as
/// `--advertised-kafka`. The inter-broker listener comes first.
pub fn resolve(
    settings: &Settings,
    kafka: Option<&str>,
    advertised_kafka: Option<&str>,
) -> Result<Vec<Listener>, String> {
    let map = parse_protocol_map(&settings.get("listener.security.protocol.map").unwrap_or_default())?;
    let advertised = match settings.get("advertised.listeners") {
        Some(v) => parse_endpoints(&v)?,
        None => vec![],
    };
    let mut listeners = match settings.get("listeners") {
        None => {
            let bind = kafka.unwrap_or("127.0.0.1:9092").to_string();
            let advertised = advertised_kafka
                .map(str::to_string)
                .or_else(|| advertised.iter().find(|(n, _)| n == "PLAINTEXT").map(|(_, a)| a.clone()));
            vec![Listener {
                name: "PLAINTEXT".into(),
                protocol: SecurityProtocol::Plaintext,
                advertised: advertised.unwrap_or_else(|| bind.clone()),
                bind,
            }]
        }
        Some(value) => {
            if kafka.is_some() || advertised_kafka.is_some() {
                return Err(
                    "--kafka/--advertised-kafka and the `listeners` setting both name Kafka listeners; use one".into(),
                );
            }
            let mut out = Vec::new();
            for (name, bind) in parse_endpoints(&value)? {
                let protocol = map.iter().find(|(n, _)| *n == name).map(|(_, p)| *p).ok_or_else(|| {
                    format!("listener {name} has no security protocol: add it to listener.security.protocol.map")
                })?;
                let advertised =
                    advertised.iter().find(|(n, _)| *n == name).map_or_else(|| bind.clone(), |(_, a)| a.clone());
                out.push(Listener { name, protocol, bind, advertised });
            }
            out
        }
    };
    if let Some((name, _)) = advertised.iter().find(|(n, _)| !listeners.iter().any(|l| l.name == *n)) {
        return Err(format!("advertised.listeners names {name}, which is not in listeners"));
    }
    for (i, a) in listeners.iter().enumerate() {
        if listeners[..i].iter().any(|b| b.bind == a.bind) {
            return Err(format!("listeners {} and another both bind {}", a.name, a.bind));
        }
    }
    let inter = match settings.get("inter.broker.listener.name") {
        Some(name) => listeners
            .iter()
            .position(|l| l.name == name)
            .ok_or_else(|| format!("inter.broker.listener.name is {name}, which is not in listeners"))?,
        None => listeners
            .iter()
            .position(|l| l.protocol == SecurityProtocol::Plaintext)
            .or_else(|| listeners.iter().position(|l| l.protocol == SecurityProtocol::Ssl))
            .unwrap_or(0),
    };
    if listeners[inter].protocol.uses_sasl() {
        return Err(format!(
            "the inter-broker listener {} is {}: brokers fetch from one another over PLAINTEXT or SSL (mutual \
             TLS), not SASL; add such a listener and name it in inter.broker.listener.name",
            listeners[inter].name,
            listeners[inter].protocol.name()
        ));
    }
    let first = listeners.remove(inter);
    listeners.insert(0, first);
    Ok(listeners)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Settings {
        let mut s = Settings::default();
        for (k, v) in pairs {
            s.set(k, v).expect("valid setting");
        }
        s
    }

    #[test]
    fn without_listeners_the_kafka_flag_is_one_plaintext_listener() {
        let l = resolve(&settings(&[]), Some("127.0.0.1:1234"), Some("broker1:1234")).expect("resolves");
        assert_eq!(
            l,
            vec![Listener {
                name: "PLAINTEXT".into(),
                protocol: SecurityProtocol::Plaintext,
                bind: "127.0.0.1:1234".into(),
                advertised: "broker1:1234".into()
            }]
        );
        assert_eq!(resolve(&settings(&[]), None, None).expect("resolves")[0].bind, "127.0.0.1:9092");
    }

    #[test]
    fn listeners_take_their_protocol_from_the_map_and_the_inter_broker_one_comes_first() {
        let s = settings(&[
            ("listeners", "SASL_SSL://0.0.0.0:9094,INTERNAL://127.0.0.1:9092,SSL://:9095"),
            ("advertised.listeners", "SASL_SSL://kafka.example:9094"),
            ("listener.security.protocol.map", "INTERNAL:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL"),
        ]);
        let l = resolve(&s, None, None).expect("resolves");
        let names: Vec<_> = l.iter().map(|l| (l.name.as_str(), l.protocol, l.advertised.as_str())).collect();
        assert_eq!(
            names,
            vec![
                ("INTERNAL", SecurityProtocol::Plaintext, "127.0.0.1:9092"),
                ("SASL_SSL", SecurityProtocol::SaslSsl, "kafka.example:9094"),
                ("SSL", SecurityProtocol::Ssl, "0.0.0.0:9095"),
            ]
        );
    }

    #[test]
    fn inconsistent_listener_settings_are_refused_with_the_reason() {
        let err =
            |pairs: &[(&str, &str)], kafka: Option<&str>| resolve(&settings(pairs), kafka, None).expect_err("refused");
        assert!(err(&[("listeners", "PLAINTEXT://127.0.0.1:1")], Some("127.0.0.1:2")).contains("use one"));
        assert!(err(&[("listeners", "CLIENTS://127.0.0.1:1")], None).contains("no security protocol"));
        assert!(err(&[("listeners", "PLAINTEXT://127.0.0.1:1"), ("advertised.listeners", "SSL://x:1")], None)
            .contains("not in listeners"));
        assert!(err(&[("listeners", "SASL_SSL://127.0.0.1:1")], None).contains("not SASL"));
        assert!(err(&[("listeners", "PLAINTEXT://127.0.0.1:1,SSL://127.0.0.1:1")], None).contains("both bind"));
        for bad in
            ["PLAINTEXT:127.0.0.1:1", "PLAINTEXT://127.0.0.1", "PLAINTEXT://h:0", "A B://h:1", "", "X://h:1,X://h:2"]
        {
            assert!(parse_endpoints(bad).is_err(), "{bad}");
        }
        assert!(parse_protocol_map("A:TLS").is_err());
    }
}
