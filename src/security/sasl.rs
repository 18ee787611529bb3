//! One connection's SASL exchange: SaslHandshake picks a mechanism,
//! SaslAuthenticate carries its messages (KIP-152), and the outcome is the
//! connection's principal.
//!
//! PLAIN and SCRAM both check the SCRAM credentials in the metadata image:
//! a PLAIN password is run through the stored salt and iterations and
//! compared with the stored key (as Redpanda does), so one set of users
//! serves both, and no password is ever stored.

use kafka_protocol::messages::{SaslAuthenticateResponse, SaslHandshakeResponse};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use strom_raft::MetadataImage;

use super::scram::{self, ScramMechanism, ScramServer, ScramStep, StoredCredential};

/// A SASL mechanism Strom speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    Plain,
    Scram(ScramMechanism),
}

impl Mechanism {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "PLAIN" => Some(Self::Plain),
            other => ScramMechanism::from_name(other).map(Self::Scram),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Plain => "PLAIN",
            Self::Scram(m) => m.name(),
        }
    }
}

/// Where the exchange stands.
enum State {
    /// Waiting for SaslHandshake.
    Start,
    /// A mechanism is chosen; its messages come in SaslAuthenticate.
    Plain,
    Scram(Box<ScramServer>),
    /// Authenticated; nothing more is expected.
    Done,
    /// Failed: the connection is to be closed.
    Failed,
}

/// What a SASL request did to the connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The exchange goes on.
    Continue,
    /// The client is `User:<name>` from now on.
    Authenticated(String),
    /// Send the answer, then close the connection (after the failed
    /// authentication delay when `delay`).
    Close { delay: bool },
}

pub struct SaslExchange {
    enabled: Vec<Mechanism>,
    state: State,
    chosen: Option<Mechanism>,
    fake_key: [u8; 32],
}

impl SaslExchange {
    /// `enabled`: `sasl.enabled.mechanisms`, in order.
    pub fn new(enabled: Vec<Mechanism>, fake_key: [u8; 32]) -> Self {
        Self { enabled, state: State::Start, chosen: None, fake_key }
    }

    pub fn is_authenticated(&self) -> bool {
        matches!(self.state, State::Done)
    }

    fn enabled_names(&self) -> Vec<StrBytes> {
        self.enabled.iter().map(|m| StrBytes::from_static_str(m.name())).collect()
    }

    /// Answers SaslHandshake.
    pub fn handshake(&mut self, mechanism: &str) -> (SaslHandshakeResponse, Outcome) {
        let response = SaslHandshakeResponse::default().with_mechanisms(self.enabled_names());
        if !matches!(self.state, State::Start) {
            self.state = State::Failed;
            return (response.with_error_code(ResponseError::IllegalSaslState.code()), Outcome::Close { delay: false });
        }
        self.chosen = Mechanism::parse(mechanism).filter(|m| self.enabled.contains(m));
        match self.chosen {
            Some(Mechanism::Plain) => self.state = State::Plain,
            Some(Mechanism::Scram(m)) => self.state = State::Scram(Box::new(ScramServer::new(m, self.fake_key))),
            None => {
                tracing::info!(mechanism, "SASL handshake for a mechanism not enabled");
                self.state = State::Failed;
                return (
                    response.with_error_code(ResponseError::UnsupportedSaslMechanism.code()),
                    Outcome::Close { delay: false },
                );
            }
        }
        (response, Outcome::Continue)
    }

    /// Answers SaslAuthenticate, checking credentials in `image`.
    pub fn authenticate(&mut self, bytes: &[u8], image: &MetadataImage) -> (SaslAuthenticateResponse, Outcome) {
        let state = std::mem::replace(&mut self.state, State::Failed);
        let result = match state {
            State::Plain => plain(bytes, image).map(|user| (Vec::new(), Some(user))),
            State::Scram(mut server) => {
                let Some(Mechanism::Scram(mechanism)) = self.chosen else { return self.out_of_order() };
                let lookup = |user: &str| credential(image, user, mechanism);
                match server.step(bytes, lookup) {
                    Ok(ScramStep::Continue(reply)) => {
                        self.state = State::Scram(server);
                        Ok((reply, None))
                    }
                    Ok(ScramStep::Done { server_final, user }) => Ok((server_final, Some(user))),
                    Err(e) => Err(e),
                }
            }
            State::Start | State::Done | State::Failed => return self.out_of_order(),
        };
        match result {
            Ok((reply, user)) => {
                let response = SaslAuthenticateResponse::default().with_auth_bytes(reply.into());
                match user {
                    None => (response, Outcome::Continue),
                    Some(user) => {
                        self.state = State::Done;
                        (response, Outcome::Authenticated(user))
                    }
                }
            }
            Err(e) => {
                let mechanism = self.chosen.map_or("", Mechanism::name);
                tracing::info!(mechanism, reason = %e, "SASL authentication failed");
                let message = match e {
                    scram::ScramError::BadCredentials => format!(
                        "Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"
                    ),
                    other => format!("Authentication failed: {other}"),
                };
                let response = SaslAuthenticateResponse::default()
                    .with_error_code(ResponseError::SaslAuthenticationFailed.code())
                    .with_error_message(Some(StrBytes::from_string(message)));
                (response, Outcome::Close { delay: true })
            }
        }
    }

    fn out_of_order(&mut self) -> (SaslAuthenticateResponse, Outcome) {
        self.state = State::Failed;
        let response = SaslAuthenticateResponse::default()
            .with_error_code(ResponseError::IllegalSaslState.code())
            .with_error_message(Some(StrBytes::from_static_str(
                "SaslAuthenticate is not expected now: send SaslHandshake first, once",
            )));
        (response, Outcome::Close { delay: false })
    }
}

/// The stored credential of `user` for `mechanism`.
pub fn credential(image: &MetadataImage, user: &str, mechanism: ScramMechanism) -> Option<StoredCredential> {
    let c = image.scram_credentials.get(user)?.get(&mechanism.kafka_code())?;
    Some(StoredCredential {
        salt: c.salt.clone(),
        stored_key: c.stored_key.clone(),
        server_key: c.server_key.clone(),
        iterations: c.iterations,
    })
}

/// Checks `user`'s password against any of their SCRAM credentials. An
/// unknown user's password is checked against a made-up credential, so the
/// answer takes as long as for a known user.
pub fn check_password(image: &MetadataImage, user: &str, password: &[u8]) -> bool {
    let mut known = ScramMechanism::ALL.iter().filter_map(|&m| Some((m, credential(image, user, m)?))).peekable();
    if known.peek().is_none() {
        static NOBODY: std::sync::OnceLock<StoredCredential> = std::sync::OnceLock::new();
        let nobody = NOBODY.get_or_init(|| {
            scram::credential_from_password(
                ScramMechanism::Sha256,
                &rand::random::<[u8; 16]>(),
                scram::DEFAULT_ITERATIONS,
            )
        });
        let _ = scram::verify_password(ScramMechanism::Sha256, nobody, password);
        return false;
    }
    known.any(|(m, c)| scram::verify_password(m, &c, password))
}

fn plain(bytes: &[u8], image: &MetadataImage) -> Result<String, scram::ScramError> {
    let (user, password) = scram::parse_plain(bytes)?;
    if check_password(image, &user, &password) {
        Ok(user)
    } else {
        Err(scram::ScramError::BadCredentials)
    }
}
