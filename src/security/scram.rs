//! Server side of the SASL mechanisms SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) and PLAIN (RFC 4616).
//!
//! The broker stores SCRAM credentials, never passwords: a salt, an iteration count, and the two keys derived from
//! the salted password (`StoredKey` and `ServerKey`). SCRAM clients prove that they know the password without
//! sending it; PLAIN clients send the password, and it is checked by deriving the same `StoredKey` again (this is
//! how Redpanda serves PLAIN without keeping a second copy of the secret).
//!
//! Everything here is transport-agnostic: the caller takes the bytes of each SaslAuthenticate request, hands them
//! to [`ScramServer::step`] (or [`parse_plain`]), and sends back whatever comes out. Client input is untrusted, so
//! every parser here returns an error instead of panicking, and messages larger than [`MAX_MESSAGE_LEN`] are refused
//! before any parsing is done.
//!
//! As in Kafka, passwords are used as raw UTF-8 bytes: no SASLprep normalisation is applied.

use std::fmt;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::{Digest, Sha256, Sha512};
use subtle::ConstantTimeEq;

/// The lowest iteration count Kafka accepts in AlterUserScramCredentials.
pub const MIN_ITERATIONS: u32 = 4096;
/// The highest iteration count Kafka accepts in AlterUserScramCredentials.
pub const MAX_ITERATIONS: u32 = 16384;
/// The iteration count used when none is given, and the one advertised for unknown users.
pub const DEFAULT_ITERATIONS: u32 = 4096;
/// The largest SASL message accepted from a client. Real SCRAM and PLAIN messages are a few hundred bytes; the cap
/// bounds the work an unauthenticated peer can cause.
pub const MAX_MESSAGE_LEN: usize = 64 * 1024;

/// Length of the salt made by [`credential_from_password`] and of the fake salt given for unknown users. Both have
/// the same length so that a salt's size does not tell a real user from a made-up one.
const SALT_LEN: usize = 32;
/// Random bytes in the server's part of the nonce; 18 bytes give 24 base64 characters, none of them a comma.
const SERVER_NONCE_BYTES: usize = 18;

/// A SCRAM variant, named by its hash function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ScramMechanism {
    /// SCRAM-SHA-256 (RFC 7677).
    Sha256,
    /// SCRAM-SHA-512 (the same construction with SHA-512, as Kafka supports it).
    Sha512,
}

impl ScramMechanism {
    /// Every supported mechanism, in the order the broker advertises them.
    pub const ALL: [ScramMechanism; 2] = [ScramMechanism::Sha256, ScramMechanism::Sha512];

    /// The SASL mechanism name, as clients ask for it in SaslHandshake.
    pub fn name(self) -> &'static str {
        match self {
            ScramMechanism::Sha256 => "SCRAM-SHA-256",
            ScramMechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    /// Looks a mechanism up by its SASL name. The match is exact and case-sensitive, as it is in Kafka.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|mech| mech.name() == name)
    }

    /// The code Kafka's admin APIs (DescribeUserScramCredentials, AlterUserScramCredentials) use for this mechanism.
    pub fn kafka_code(self) -> i8 {
        match self {
            ScramMechanism::Sha256 => 1,
            ScramMechanism::Sha512 => 2,
        }
    }

    /// The mechanism for a Kafka admin API code; `None` for 0 (Kafka's UNKNOWN) and anything else.
    pub fn from_kafka_code(code: i8) -> Option<Self> {
        Self::ALL.into_iter().find(|mech| mech.kafka_code() == code)
    }

    /// Output length of the mechanism's hash, which is also the length of every key and of the client proof.
    pub fn hash_len(self) -> usize {
        match self {
            ScramMechanism::Sha256 => 32,
            ScramMechanism::Sha512 => 64,
        }
    }

    /// HMAC with this mechanism's hash over the concatenation of `parts`.
    fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
        match self {
            ScramMechanism::Sha256 => hmac_with::<Hmac<Sha256>>(key, parts),
            ScramMechanism::Sha512 => hmac_with::<Hmac<Sha512>>(key, parts),
        }
    }

    /// This mechanism's hash of `data`.
    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            ScramMechanism::Sha256 => Sha256::digest(data).to_vec(),
            ScramMechanism::Sha512 => Sha512::digest(data).to_vec(),
        }
    }
}

/// HMAC over the concatenation of `parts`. HMAC takes keys of any length, so the error branch cannot be reached; it
/// returns an empty tag, which matches nothing, rather than panicking.
fn hmac_with<M: Mac + KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    match <M as KeyInit>::new_from_slice(key) {
        Ok(mut mac) => {
            for part in parts {
                mac.update(part);
            }
            mac.finalize().into_bytes().to_vec()
        }
        Err(_) => Vec::new(),
    }
}

/// A SCRAM credential as the broker stores it. It holds what is needed to check a client's proof and to prove the
/// server's own identity, but not the password, nor anything that lets a reader of the store log in as the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCredential {
    /// Random salt mixed into the password before hashing.
    pub salt: Vec<u8>,
    /// `H(HMAC(SaltedPassword, "Client Key"))`: checks the client's proof.
    pub stored_key: Vec<u8>,
    /// `HMAC(SaltedPassword, "Server Key")`: signs the server's final message.
    pub server_key: Vec<u8>,
    /// PBKDF2 iteration count used to make the salted password.
    pub iterations: u32,
}

/// SCRAM's `Hi()`: PBKDF2 with HMAC over the mechanism's hash, giving one hash length of output.
///
/// The cost is linear in `iterations`; callers that take the count from a client must bound it first (Kafka's
/// bounds are [`MIN_ITERATIONS`] and [`MAX_ITERATIONS`]).
pub fn salted_password(mech: ScramMechanism, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
    let mut out = vec![0u8; mech.hash_len()];
    match mech {
        ScramMechanism::Sha256 => pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out),
        ScramMechanism::Sha512 => pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out),
    }
    out
}

/// Builds the stored credential from an already salted password. This is what AlterUserScramCredentials needs, since
/// Kafka clients send the salted password rather than the password itself.
pub fn credential_from_salted(
    mech: ScramMechanism,
    salted_password: &[u8],
    salt: &[u8],
    iterations: u32,
) -> StoredCredential {
    let client_key = mech.hmac(salted_password, &[b"Client Key"]);
    StoredCredential {
        salt: salt.to_vec(),
        stored_key: mech.hash(&client_key),
        server_key: mech.hmac(salted_password, &[b"Server Key"]),
        iterations,
    }
}

/// Builds a stored credential from a password, with a fresh random 32-byte salt.
pub fn credential_from_password(mech: ScramMechanism, password: &[u8], iterations: u32) -> StoredCredential {
    let mut salt = vec![0u8; SALT_LEN];
    rand::thread_rng().fill_bytes(&mut salt);
    let salted = salted_password(mech, password, &salt, iterations);
    credential_from_salted(mech, &salted, &salt, iterations)
}

/// Checks a password (from PLAIN) against a SCRAM credential by deriving the `StoredKey` again and comparing it in
/// constant time. This costs one PBKDF2 run at the credential's iteration count.
pub fn verify_password(mech: ScramMechanism, cred: &StoredCredential, password: &[u8]) -> bool {
    let salted = salted_password(mech, password, &cred.salt, cred.iterations);
    let derived = credential_from_salted(mech, &salted, &cred.salt, cred.iterations);
    derived.stored_key.ct_eq(&cred.stored_key).into()
}

/// Why a SASL exchange was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScramError {
    /// The client's message breaks the protocol or asks for something not supported. The text says what, and is
    /// safe to send back to the client: it never depends on whether the user exists.
    #[error("malformed SASL message: {0}")]
    Malformed(String),
    /// Unknown user or wrong password. The two are deliberately not told apart.
    #[error("authentication failed: invalid credentials")]
    BadCredentials,
    /// A message arrived after the exchange had already finished, successfully or not.
    #[error("SASL message received out of order")]
    OutOfOrder,
}

fn malformed(reason: impl Into<String>) -> ScramError {
    ScramError::Malformed(reason.into())
}

/// What the server sends after a successful step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScramStep {
    /// The server-first-message; the exchange goes on with the client's final message.
    Continue(Vec<u8>),
    /// The client is authenticated as `user`; `server_final` (`v=...`) lets the client check the server in turn.
    Done { server_final: Vec<u8>, user: String },
}

/// One SCRAM exchange, server side. Make a new one per authentication attempt.
pub struct ScramServer {
    mech: ScramMechanism,
    /// Per-process secret from which fake salts for unknown users are derived, so that they are stable for a given
    /// name (as a real salt would be) yet cannot be predicted by clients.
    fake_key: [u8; 32],
    /// The server's half of the nonce, chosen when the exchange is created.
    server_nonce: String,
    state: State,
}

/// Where an exchange is. Any error moves it to `Finished`, so a failed exchange cannot be retried or resumed.
enum State {
    AwaitingClientFirst,
    AwaitingClientFinal(Box<Exchange>),
    Finished,
}

/// What the server keeps between the first and the final message.
struct Exchange {
    /// The gs2 header exactly as the client sent it (e.g. `n,,`); the final message's `c=` must repeat it.
    gs2_header: String,
    client_first_bare: String,
    server_first: String,
    /// Client nonce followed by server nonce; the final message's `r=` must repeat it.
    nonce: String,
    user: String,
    /// The user's credential, or a made-up one for an unknown user.
    credential: StoredCredential,
    /// False when `credential` is made up; the exchange then fails at the final step whatever the proof.
    known_user: bool,
}

impl fmt::Debug for ScramServer {
    /// Shows the mechanism and the stage only: the fake key and the credentials are secrets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let stage = match self.state {
            State::AwaitingClientFirst => "awaiting client-first",
            State::AwaitingClientFinal(_) => "awaiting client-final",
            State::Finished => "finished",
        };
        f.debug_struct("ScramServer").field("mech", &self.mech).field("stage", &stage).finish_non_exhaustive()
    }
}

impl ScramServer {
    /// Starts an exchange for `mech`. `fake_key` must be a secret kept for the life of the process (the same for
    /// every exchange): unknown users get a salt derived from it, so that answers do not reveal who exists.
    pub fn new(mech: ScramMechanism, fake_key: [u8; 32]) -> Self {
        let mut random = [0u8; SERVER_NONCE_BYTES];
        rand::thread_rng().fill_bytes(&mut random);
        Self::with_nonce(mech, fake_key, BASE64.encode(random))
    }

    /// Starts an exchange with a given server nonce. Only tests choose the nonce, to replay published vectors.
    fn with_nonce(mech: ScramMechanism, fake_key: [u8; 32], server_nonce: String) -> Self {
        ScramServer { mech, fake_key, server_nonce, state: State::AwaitingClientFirst }
    }

    /// Feeds the next client message: client-first, then client-final. Returns the message to send back.
    ///
    /// `lookup(user)` is called once, while handling client-first, with the decoded user name; it returns the user's
    /// credential for this mechanism, or `None` if there is none. For an unknown user the exchange goes on with a
    /// made-up salt and fails only at the final step, with [`ScramError::BadCredentials`], the same error a wrong
    /// password gives.
    ///
    /// After `Done` or any error, every further call returns [`ScramError::OutOfOrder`].
    pub fn step(
        &mut self,
        input: &[u8],
        lookup: impl FnOnce(&str) -> Option<StoredCredential>,
    ) -> Result<ScramStep, ScramError> {
        match std::mem::replace(&mut self.state, State::Finished) {
            State::AwaitingClientFirst => {
                let exchange = self.client_first(input, lookup)?;
                let reply = exchange.server_first.clone().into_bytes();
                self.state = State::AwaitingClientFinal(Box::new(exchange));
                Ok(ScramStep::Continue(reply))
            }
            State::AwaitingClientFinal(exchange) => self.client_final(&exchange, input),
            State::Finished => Err(ScramError::OutOfOrder),
        }
    }

    /// Handles client-first-message: `gs2-header client-first-message-bare`, e.g. `n,,n=user,r=nonce`.
    fn client_first(
        &self,
        input: &[u8],
        lookup: impl FnOnce(&str) -> Option<StoredCredential>,
    ) -> Result<Exchange, ScramError> {
        let message = message_text(input)?;
        let first = parse_client_first(message)?;

        let (credential, known_user) = match lookup(&first.user) {
            Some(credential) => (credential, true),
            None => (self.fake_credential(&first.user), false),
        };

        let nonce = format!("{}{}", first.client_nonce, self.server_nonce);
        let server_first = format!("r={},s={},i={}", nonce, BASE64.encode(&credential.salt), credential.iterations);
        Ok(Exchange {
            gs2_header: first.gs2_header.to_owned(),
            client_first_bare: first.bare.to_owned(),
            server_first,
            nonce,
            user: first.user,
            credential,
            known_user,
        })
    }

    /// A credential for a user that does not exist. The salt is stable for a given user and mechanism, like a real
    /// one, and 32 bytes long whatever the mechanism, like one from [`credential_from_password`]. The mechanism name
    /// is mixed in so that the two mechanisms give different salts, as two real credentials would. The keys only
    /// exist so that the final step does the same work as for a real user; they never match.
    fn fake_credential(&self, user: &str) -> StoredCredential {
        let name = self.mech.name().as_bytes();
        let user = user.as_bytes();
        StoredCredential {
            salt: ScramMechanism::Sha256.hmac(&self.fake_key, &[b"salt\0", name, b"\0", user]),
            stored_key: self.mech.hmac(&self.fake_key, &[b"stored key\0", name, b"\0", user]),
            server_key: self.mech.hmac(&self.fake_key, &[b"server key\0", name, b"\0", user]),
            iterations: DEFAULT_ITERATIONS,
        }
    }

    /// Handles client-final-message: `c=<base64 gs2 header>,r=<nonce>[,extensions],p=<base64 proof>`.
    fn client_final(&self, exchange: &Exchange, input: &[u8]) -> Result<ScramStep, ScramError> {
        let message = message_text(input)?;

        // The proof is always the last attribute, and the AuthMessage covers everything before it.
        let (without_proof, proof_attr) =
            message.rsplit_once(',').ok_or_else(|| malformed("client-final-message has no proof"))?;
        let proof_b64 =
            proof_attr.strip_prefix("p=").ok_or_else(|| malformed("client-final-message does not end with a proof"))?;

        let mut attrs = without_proof.split(',');
        let channel_binding = attrs
            .next()
            .and_then(|attr| attr.strip_prefix("c="))
            .ok_or_else(|| malformed("client-final-message must start with c="))?;
        let nonce = attrs
            .next()
            .and_then(|attr| attr.strip_prefix("r="))
            .ok_or_else(|| malformed("client-final-message must have r= second"))?;
        for extension in attrs {
            check_extension(extension)?;
        }

        // Without channel binding, c= carries the gs2 header back, which shows it was not altered in transit.
        let channel_binding =
            BASE64.decode(channel_binding).map_err(|_| malformed("channel binding is not valid base64"))?;
        if channel_binding != exchange.gs2_header.as_bytes() {
            return Err(malformed("channel binding mismatch"));
        }
        if nonce != exchange.nonce && !is_librdkafka_nonce(nonce, &exchange.nonce, &self.server_nonce) {
            return Err(malformed("nonce mismatch"));
        }
        let proof = BASE64.decode(proof_b64).map_err(|_| malformed("proof is not valid base64"))?;
        if proof.len() != self.mech.hash_len() {
            return Err(malformed("proof has the wrong length"));
        }

        // AuthMessage = client-first-message-bare "," server-first-message "," client-final-message-without-proof
        let auth_message = format!("{},{},{}", exchange.client_first_bare, exchange.server_first, without_proof);
        let credential = &exchange.credential;

        // ClientKey = ClientProof XOR HMAC(StoredKey, AuthMessage); the client knows the password iff
        // H(ClientKey) == StoredKey. The comparison is constant-time so that timing gives nothing away.
        let client_signature = self.mech.hmac(&credential.stored_key, &[auth_message.as_bytes()]);
        let client_key: Vec<u8> = proof.iter().zip(&client_signature).map(|(p, s)| p ^ s).collect();
        let proof_ok: bool = self.mech.hash(&client_key).ct_eq(&credential.stored_key).into();
        let server_signature = self.mech.hmac(&credential.server_key, &[auth_message.as_bytes()]);

        if !(proof_ok && exchange.known_user) {
            return Err(ScramError::BadCredentials);
        }
        let server_final = format!("v={}", BASE64.encode(server_signature)).into_bytes();
        Ok(ScramStep::Done { server_final, user: exchange.user.clone() })
    }
}

/// librdkafka before 2.6.1 (Debian's kcat, for one) sends its client nonce
/// twice in the final message: client nonce, then the whole nonce
/// (librdkafka#4895). Kafka 3.x took it; so does Strom, in exactly that form.
/// The proof covers the message as sent, so the server nonce is still bound.
fn is_librdkafka_nonce(sent: &str, nonce: &str, server_nonce: &str) -> bool {
    let Some(client_nonce) = nonce.strip_suffix(server_nonce) else { return false };
    sent.strip_prefix(client_nonce) == Some(nonce)
}

/// The parts of a client-first-message that the server needs; borrowed from the message where possible.
struct ClientFirst<'a> {
    gs2_header: &'a str,
    bare: &'a str,
    user: String,
    client_nonce: &'a str,
}

/// Parses client-first-message. Grammar (RFC 5802 section 7, with Kafka's extensions allowed):
///
/// ```text
/// gs2-header  = ("n" / "y" / "p=" cb-name) "," ["a=" saslname] ","
/// bare        = ["m=" ext ","] "n=" saslname "," "r=" nonce *("," key "=" value)
/// ```
fn parse_client_first(message: &str) -> Result<ClientFirst<'_>, ScramError> {
    let mut parts = message.splitn(3, ',');
    let (Some(flag), Some(authzid_field), Some(bare)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(malformed("client-first-message has no gs2 header"));
    };
    match flag {
        // "y" means the client could bind to the channel but thinks the server cannot, which is true here.
        "n" | "y" => {}
        _ if flag.starts_with("p=") => return Err(malformed("channel binding not supported")),
        _ => return Err(malformed("invalid gs2 channel binding flag")),
    }
    let authzid = match authzid_field {
        "" => None,
        _ => {
            let encoded =
                authzid_field.strip_prefix("a=").ok_or_else(|| malformed("invalid authorization id in gs2 header"))?;
            Some(decode_saslname(encoded)?)
        }
    };
    // The header is the flag and the authzid field with their two commas, exactly as sent.
    let gs2_header = &message[..flag.len() + authzid_field.len() + 2];

    if bare.starts_with("m=") {
        return Err(malformed("mandatory extensions are not supported"));
    }
    let mut attrs = bare.split(',');
    let user = attrs
        .next()
        .and_then(|attr| attr.strip_prefix("n="))
        .ok_or_else(|| malformed("client-first-message must have n= first"))?;
    let user = decode_saslname(user)?;
    let client_nonce = attrs
        .next()
        .and_then(|attr| attr.strip_prefix("r="))
        .ok_or_else(|| malformed("client-first-message must have r= second"))?;
    check_nonce(client_nonce)?;
    for extension in attrs {
        check_extension(extension)?;
        if let Some(value) = extension.strip_prefix("tokenauth=") {
            // Kafka clients authenticating with a delegation token say so this way.
            if value.eq_ignore_ascii_case("true") {
                return Err(malformed("delegation tokens are not supported"));
            }
        }
    }

    // A client may only act as itself: proxy authorization is not supported.
    if let Some(authzid) = authzid {
        if authzid != user {
            return Err(malformed("authorization id does not match user"));
        }
    }
    Ok(ClientFirst { gs2_header, bare, user, client_nonce })
}

/// Decodes a saslname: `=2C` stands for `,` and `=3D` for `=`; any other `=` sequence, a NUL, or an empty name is
/// malformed.
fn decode_saslname(encoded: &str) -> Result<String, ScramError> {
    if encoded.is_empty() {
        return Err(malformed("empty user name"));
    }
    let mut decoded = String::with_capacity(encoded.len());
    let mut rest = encoded;
    while let Some(pos) = rest.find(['=', '\0']) {
        decoded.push_str(&rest[..pos]);
        let escape = rest.get(pos..pos + 3);
        match escape {
            Some("=2C") => decoded.push(','),
            Some("=3D") => decoded.push('='),
            _ => return Err(malformed("invalid escape in user name")),
        }
        rest = &rest[pos + 3..];
    }
    decoded.push_str(rest);
    Ok(decoded)
}

/// A nonce is one or more printable ASCII characters other than `,` (which the split has already removed).
fn check_nonce(nonce: &str) -> Result<(), ScramError> {
    if nonce.is_empty() || !nonce.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Err(malformed("nonce must be printable ASCII"));
    }
    Ok(())
}

/// Checks that an optional extension is `key=value` with an alphabetic key. Unknown extensions are ignored, as RFC
/// 5802 allows, but the attribute letters SCRAM itself uses may not reappear as extensions: a repeated `r=` or `p=`
/// is more likely an attack or a broken client than something to skip over.
fn check_extension(extension: &str) -> Result<(), ScramError> {
    let Some((key, _value)) = extension.split_once('=') else {
        return Err(malformed("extension is not key=value"));
    };
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphabetic()) {
        return Err(malformed("extension name must be alphabetic"));
    }
    if matches!(key, "a" | "c" | "e" | "i" | "m" | "n" | "p" | "r" | "s" | "v") {
        return Err(malformed("duplicate or misplaced attribute"));
    }
    Ok(())
}

/// Checks size and encoding of a client message before parsing it.
fn message_text(input: &[u8]) -> Result<&str, ScramError> {
    if input.len() > MAX_MESSAGE_LEN {
        return Err(malformed("message too large"));
    }
    std::str::from_utf8(input).map_err(|_| malformed("message is not UTF-8"))
}

/// Parses a PLAIN message, `authzid NUL authcid NUL passwd`, into the user (authcid) and the password.
///
/// The authzid must be empty or equal to the user, since acting for another user is not supported. User and authzid
/// must be UTF-8; the password is returned as raw bytes and is checked as such. Empty user or password, a missing or
/// extra NUL, or a message over [`MAX_MESSAGE_LEN`] is malformed.
pub fn parse_plain(input: &[u8]) -> Result<(String, Vec<u8>), ScramError> {
    if input.len() > MAX_MESSAGE_LEN {
        return Err(malformed("message too large"));
    }
    let mut parts = input.split(|&b| b == 0);
    let (Some(authzid), Some(user), Some(password), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(malformed("PLAIN message must be authzid NUL user NUL password"));
    };
    let authzid = std::str::from_utf8(authzid).map_err(|_| malformed("authorization id is not UTF-8"))?;
    let user = std::str::from_utf8(user).map_err(|_| malformed("user name is not UTF-8"))?;
    if user.is_empty() {
        return Err(malformed("empty user name"));
    }
    if password.is_empty() {
        return Err(malformed("empty password"));
    }
    if !authzid.is_empty() && authzid != user {
        return Err(malformed("authorization id does not match user"));
    }
    Ok((user.to_owned(), password.to_vec()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    const FAKE_KEY: [u8; 32] = [7u8; 32];

    fn b64(data: &[u8]) -> String {
        BASE64.encode(data)
    }

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
    }

    fn text(bytes: &[u8]) -> &str {
        std::str::from_utf8(bytes).unwrap()
    }

    /// A minimal SCRAM client, written from the RFC independently of the server code paths it checks.
    struct Client {
        mech: ScramMechanism,
        gs2_header: String,
        bare: String,
        password: Vec<u8>,
    }

    impl Client {
        fn new(mech: ScramMechanism, encoded_user: &str, password: &str, nonce: &str) -> Self {
            Self::with_header(mech, "n,,", encoded_user, password, nonce)
        }

        fn with_header(mech: ScramMechanism, gs2: &str, encoded_user: &str, password: &str, nonce: &str) -> Self {
            Client {
                mech,
                gs2_header: gs2.to_owned(),
                bare: format!("n={encoded_user},r={nonce}"),
                password: password.as_bytes().to_vec(),
            }
        }

        fn first(&self) -> Vec<u8> {
            format!("{}{}", self.gs2_header, self.bare).into_bytes()
        }

        /// Returns client-final and the server-final the client expects.
        fn finish(&self, server_first: &[u8]) -> (Vec<u8>, Vec<u8>) {
            self.finish_with(server_first, &b64(self.gs2_header.as_bytes()), None)
        }

        fn finish_with(&self, server_first: &[u8], cbind: &str, nonce: Option<&str>) -> (Vec<u8>, Vec<u8>) {
            let server_first = text(server_first);
            let mut attrs = server_first.split(',');
            let combined = attrs.next().unwrap().strip_prefix("r=").unwrap();
            let salt = BASE64.decode(attrs.next().unwrap().strip_prefix("s=").unwrap()).unwrap();
            let iterations: u32 = attrs.next().unwrap().strip_prefix("i=").unwrap().parse().unwrap();

            let salted = salted_password(self.mech, &self.password, &salt, iterations);
            let client_key = self.mech.hmac(&salted, &[b"Client Key"]);
            let stored_key = self.mech.hash(&client_key);
            let server_key = self.mech.hmac(&salted, &[b"Server Key"]);
            let without_proof = format!("c={},r={}", cbind, nonce.unwrap_or(combined));
            let auth = format!("{},{},{}", self.bare, server_first, without_proof);
            let signature = self.mech.hmac(&stored_key, &[auth.as_bytes()]);
            let proof: Vec<u8> = client_key.iter().zip(&signature).map(|(k, s)| k ^ s).collect();
            let server_signature = self.mech.hmac(&server_key, &[auth.as_bytes()]);
            (
                format!("{},p={}", without_proof, b64(&proof)).into_bytes(),
                format!("v={}", b64(&server_signature)).into_bytes(),
            )
        }
    }

    fn continue_bytes(step: Result<ScramStep, ScramError>) -> Vec<u8> {
        match step {
            Ok(ScramStep::Continue(bytes)) => bytes,
            other => panic!("expected Continue, got {other:?}"),
        }
    }

    fn lookup_for(user: &'static str, cred: StoredCredential) -> impl FnOnce(&str) -> Option<StoredCredential> {
        move |name| (name == user).then_some(cred)
    }

    /// Runs a full exchange for a client against a server holding `cred` for `user`.
    fn run(client: &Client, user: &'static str, cred: StoredCredential) -> Result<ScramStep, ScramError> {
        let mut server = ScramServer::new(client.mech, FAKE_KEY);
        let server_first = server.step(&client.first(), lookup_for(user, cred))?;
        let ScramStep::Continue(server_first) = server_first else { panic!("expected Continue") };
        let (client_final, _) = client.finish(&server_first);
        server.step(&client_final, |_| None)
    }

    fn cred(mech: ScramMechanism, password: &str) -> StoredCredential {
        credential_from_password(mech, password.as_bytes(), MIN_ITERATIONS)
    }

    fn expect_malformed(result: Result<ScramStep, ScramError>, needle: &str) {
        match result {
            Err(ScramError::Malformed(reason)) => {
                assert!(reason.contains(needle), "reason {reason:?} lacks {needle:?}")
            }
            other => panic!("expected Malformed({needle}), got {other:?}"),
        }
    }

    /// Sends a client-first message and expects it to be refused.
    fn first_malformed(message: &str, needle: &str) {
        let mut server = ScramServer::new(ScramMechanism::Sha256, FAKE_KEY);
        let result = server.step(message.as_bytes(), |_| Some(cred(ScramMechanism::Sha256, "pw")));
        expect_malformed(result, needle);
        assert_eq!(server.step(b"n,,n=user,r=abc", |_| None), Err(ScramError::OutOfOrder));
    }

    #[test]
    fn rfc7677_sha256_vector() {
        let mech = ScramMechanism::Sha256;
        let salt = BASE64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let salted = salted_password(mech, b"pencil", &salt, 4096);
        let credential = credential_from_salted(mech, &salted, &salt, 4096);

        let mut server = ScramServer::with_nonce(mech, FAKE_KEY, "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0".to_owned());
        let mut looked_up = None;
        let server_first = continue_bytes(server.step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO", |user| {
            looked_up = Some(user.to_owned());
            Some(credential.clone())
        }));
        assert_eq!(looked_up.as_deref(), Some("user"));
        assert_eq!(
            text(&server_first),
            "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
        );

        let client_final = b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
        let done = server.step(client_final, |_| panic!("lookup must not be called twice")).unwrap();
        assert_eq!(
            done,
            ScramStep::Done {
                server_final: b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=".to_vec(),
                user: "user".to_owned()
            }
        );

        // The test client agrees with the RFC, so the other tests can rely on it.
        let client = Client::new(mech, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
        let (final_msg, expected) = client.finish(&server_first);
        assert_eq!(final_msg, client_final.to_vec());
        assert_eq!(expected, b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=".to_vec());
    }

    #[test]
    fn pbkdf2_sha256_known_answer() {
        let out = salted_password(ScramMechanism::Sha256, b"password", b"salt", 4096);
        assert_eq!(out, hex("c5e478d59288c841aa530db6845c4c8d962893a001ce4e11a4963873aa98134a"));
        assert_eq!(salted_password(ScramMechanism::Sha512, b"password", b"salt", 1).len(), 64);
    }

    #[test]
    fn sha512_round_trip() {
        let mech = ScramMechanism::Sha512;
        let credential = cred(mech, "s3cret");
        let client = Client::new(mech, "alice", "s3cret", "fyko+d2lbbFgONRv9qkxdawL");
        let mut server = ScramServer::new(mech, FAKE_KEY);
        let server_first = continue_bytes(server.step(&client.first(), lookup_for("alice", credential.clone())));

        let server_first_text = text(&server_first);
        assert!(server_first_text.starts_with("r=fyko+d2lbbFgONRv9qkxdawL"));
        let server_nonce = server_first_text.split(',').next().unwrap().len() - "r=fyko+d2lbbFgONRv9qkxdawL".len();
        assert!(server_nonce >= 24);
        assert!(server_first_text.ends_with(&format!(",s={},i=4096", b64(&credential.salt))));

        let (client_final, expected_final) = client.finish(&server_first);
        let done = server.step(&client_final, |_| None).unwrap();
        assert_eq!(done, ScramStep::Done { server_final: expected_final, user: "alice".to_owned() });
    }

    #[test]
    fn server_nonces_differ() {
        let a = continue_bytes(ScramServer::new(ScramMechanism::Sha256, FAKE_KEY).step(b"n,,n=u,r=x", |_| None));
        let b = continue_bytes(ScramServer::new(ScramMechanism::Sha256, FAKE_KEY).step(b"n,,n=u,r=x", |_| None));
        assert_ne!(text(&a).split(',').next(), text(&b).split(',').next());
    }

    #[test]
    fn y_flag_and_matching_authzid_round_trip() {
        let mech = ScramMechanism::Sha256;
        let client = Client::with_header(mech, "y,,", "bob", "pw", "abc");
        assert!(matches!(run(&client, "bob", cred(mech, "pw")), Ok(ScramStep::Done { .. })));
        let client = Client::with_header(mech, "n,a=bob,", "bob", "pw", "abc");
        assert!(matches!(run(&client, "bob", cred(mech, "pw")), Ok(ScramStep::Done { .. })));
    }

    #[test]
    fn wrong_password_is_bad_credentials() {
        for mech in ScramMechanism::ALL {
            let client = Client::new(mech, "alice", "wrong", "abc");
            assert_eq!(run(&client, "alice", cred(mech, "right")), Err(ScramError::BadCredentials));
        }
    }

    #[test]
    fn credential_for_other_mechanism_is_bad_credentials() {
        let client = Client::new(ScramMechanism::Sha256, "alice", "pw", "abc");
        assert_eq!(run(&client, "alice", cred(ScramMechanism::Sha512, "pw")), Err(ScramError::BadCredentials));
    }

    #[test]
    fn unknown_user_looks_real_until_the_end() {
        for mech in ScramMechanism::ALL {
            let client = Client::new(mech, "ghost", "whatever", "abc");
            let mut server = ScramServer::new(mech, FAKE_KEY);
            let server_first = continue_bytes(server.step(&client.first(), |_| None));
            let first_text = text(&server_first).to_owned();
            let attrs: Vec<&str> = first_text.split(',').collect();
            assert_eq!(attrs.len(), 3);
            assert!(attrs[0].starts_with("r=abc") && attrs[0].len() >= 2 + 3 + 24);
            assert_eq!(BASE64.decode(attrs[1].strip_prefix("s=").unwrap()).unwrap().len(), 32);
            assert_eq!(attrs[2], "i=4096");

            let (client_final, _) = client.finish(&server_first);
            assert_eq!(server.step(&client_final, |_| None), Err(ScramError::BadCredentials));

            // The fake salt is stable per user and fake key, like a real one, and differs between users.
            let salt_of = |user: &str, key: [u8; 32], mech: ScramMechanism| {
                let message = format!("n,,n={user},r=abc");
                let first = continue_bytes(ScramServer::new(mech, key).step(message.as_bytes(), |_| None));
                text(&first).split(',').nth(1).unwrap().to_owned()
            };
            assert_eq!(salt_of("ghost", FAKE_KEY, mech), attrs[1]);
            assert_ne!(salt_of("ghost2", FAKE_KEY, mech), attrs[1]);
            assert_ne!(salt_of("ghost", [9u8; 32], mech), attrs[1]);
        }
        let salt_256 = ScramServer::new(ScramMechanism::Sha256, FAKE_KEY).fake_credential("ghost").salt;
        let salt_512 = ScramServer::new(ScramMechanism::Sha512, FAKE_KEY).fake_credential("ghost").salt;
        assert_ne!(salt_256, salt_512);
    }

    #[test]
    fn the_nonce_of_librdkafka_before_2_6_1_is_taken_and_nothing_looser() {
        let mech = ScramMechanism::Sha256;
        let client = Client::new(mech, "alice", "pw", "abc");
        let mut server = ScramServer::new(mech, FAKE_KEY);
        let server_first = continue_bytes(server.step(&client.first(), lookup_for("alice", cred(mech, "pw"))));
        let combined = text(&server_first).split(',').next().unwrap().strip_prefix("r=").unwrap().to_owned();
        let doubled = format!("abc{combined}");
        let (client_final, expected) = client.finish_with(&server_first, "biws", Some(&doubled));
        assert_eq!(
            server.step(&client_final, |_| None),
            Ok(ScramStep::Done { server_final: expected, user: "alice".into() })
        );
        let forms: [fn(&str) -> String; 3] = [|n| format!("x{n}"), |n| format!("abcabc{n}"), |n| format!("{n}abc")];
        for form in forms {
            let mut server = ScramServer::new(mech, FAKE_KEY);
            let first = continue_bytes(server.step(&client.first(), lookup_for("alice", cred(mech, "pw"))));
            let combined = text(&first).split(',').next().unwrap().strip_prefix("r=").unwrap().to_owned();
            let (client_final, _) = client.finish_with(&first, "biws", Some(&form(&combined)));
            expect_malformed(server.step(&client_final, |_| None), "nonce mismatch");
        }
    }

    #[test]
    fn wrong_nonce_is_malformed() {
        let mech = ScramMechanism::Sha256;
        let client = Client::new(mech, "alice", "pw", "abc");
        let mut server = ScramServer::new(mech, FAKE_KEY);
        let server_first = continue_bytes(server.step(&client.first(), lookup_for("alice", cred(mech, "pw"))));
        let (client_final, _) = client.finish_with(&server_first, "biws", Some("abcXYZ"));
        expect_malformed(server.step(&client_final, |_| None), "nonce mismatch");
        assert_eq!(server.step(&client_final, |_| None), Err(ScramError::OutOfOrder));
    }

    #[test]
    fn bad_channel_binding_is_malformed() {
        let mech = ScramMechanism::Sha256;
        let client = Client::new(mech, "alice", "pw", "abc");
        for cbind in ["eSws", "biws=", "!!!", ""] {
            let mut server = ScramServer::new(mech, FAKE_KEY);
            let server_first = continue_bytes(server.step(&client.first(), lookup_for("alice", cred(mech, "pw"))));
            let (client_final, _) = client.finish_with(&server_first, cbind, None);
            expect_malformed(server.step(&client_final, |_| None), "channel binding");
        }
    }

    #[test]
    fn channel_binding_flag_p_is_refused() {
        first_malformed("p=tls-unique,,n=user,r=abc", "channel binding not supported");
        first_malformed("p=tls-server-end-point,a=user,n=user,r=abc", "channel binding not supported");
        first_malformed("x,,n=user,r=abc", "gs2");
        first_malformed("n,,", "n=");
        first_malformed("n,n=user,r=abc", "authorization id");
        first_malformed("", "gs2");
    }

    #[test]
    fn escaped_user_names() {
        let mech = ScramMechanism::Sha256;
        let client = Client::new(mech, "a=2Cb=3Dc", "pw", "abc");
        let mut server = ScramServer::new(mech, FAKE_KEY);
        let mut seen = String::new();
        let server_first = continue_bytes(server.step(&client.first(), |user| {
            seen = user.to_owned();
            Some(cred(mech, "pw"))
        }));
        assert_eq!(seen, "a,b=c");
        let (client_final, _) = client.finish(&server_first);
        match server.step(&client_final, |_| None) {
            Ok(ScramStep::Done { user, .. }) => assert_eq!(user, "a,b=c"),
            other => panic!("unexpected {other:?}"),
        }

        for bad in ["n,,n=a=2Db,r=abc", "n,,n=a=2cb,r=abc", "n,,n=a=2,r=abc", "n,,n=a=,r=abc", "n,,n==,r=abc"] {
            first_malformed(bad, "escape");
        }
        first_malformed("n,,n=a\0b,r=abc", "escape");
        first_malformed("n,,n=,r=abc", "empty user name");
        assert_eq!(decode_saslname("=3D=2C").unwrap(), "=,");
        assert_eq!(decode_saslname("üser=2C").unwrap(), "üser,");
    }

    #[test]
    fn authzid_must_match_user() {
        first_malformed("n,a=admin,n=alice,r=abc", "authorization id does not match user");
        first_malformed("n,a=,n=alice,r=abc", "empty user name");
        let mech = ScramMechanism::Sha256;
        let client = Client::with_header(mech, "n,a=a=2Cb,", "a=2Cb", "pw", "abc");
        assert!(matches!(run(&client, "a,b", cred(mech, "pw")), Ok(ScramStep::Done { .. })));
    }

    #[test]
    fn extensions() {
        first_malformed("n,,m=foo,n=alice,r=abc", "mandatory extensions");
        first_malformed("n,,n=alice,r=abc,tokenauth=true", "delegation tokens are not supported");
        first_malformed("n,,n=alice,r=abc,tokenauth=TRUE", "delegation tokens are not supported");
        first_malformed("n,,n=alice,r=abc,junk", "key=value");
        first_malformed("n,,n=alice,r=abc,", "key=value");
        first_malformed("n,,n=alice,r=abc,r=def", "duplicate");
        first_malformed("n,,n=alice,r=abc,1x=y", "alphabetic");
        first_malformed("n,,r=abc,n=alice", "n= first");
        first_malformed("n,,n=alice", "r= second");

        // Unknown extensions are ignored, and are part of the AuthMessage like everything else.
        let mech = ScramMechanism::Sha256;
        let client = Client::new(mech, "alice", "pw", "abc,tokenauth=false,foo=bar");
        assert!(matches!(run(&client, "alice", cred(mech, "pw")), Ok(ScramStep::Done { .. })));
    }

    #[test]
    fn nonce_must_be_printable() {
        first_malformed("n,,n=alice,r=", "nonce");
        first_malformed("n,,n=alice,r=ab c", "nonce");
        first_malformed("n,,n=alice,r=abü", "nonce");
        first_malformed("n,,n=alice,r=ab\x7f", "nonce");
    }

    /// Drives a good client-first, then sends `client_final` as given.
    fn final_result(client_final: &str) -> Result<ScramStep, ScramError> {
        let mech = ScramMechanism::Sha256;
        let mut server = ScramServer::with_nonce(mech, FAKE_KEY, "SERVER".to_owned());
        continue_bytes(server.step(b"n,,n=alice,r=abc", lookup_for("alice", cred(mech, "pw"))));
        server.step(client_final.as_bytes(), |_| None)
    }

    #[test]
    fn malformed_client_final() {
        let proof = b64(&[0u8; 32]);
        expect_malformed(final_result("c=biws,r=abcSERVER"), "proof");
        expect_malformed(final_result("c=biws"), "proof");
        expect_malformed(final_result(""), "no proof");
        expect_malformed(final_result(&format!("r=abcSERVER,c=biws,p={proof}")), "c=");
        expect_malformed(final_result(&format!("c=biws,p={proof}")), "r=");
        expect_malformed(final_result("c=biws,r=abcSERVER,p=AAAA"), "wrong length");
        expect_malformed(final_result(&format!("c=biws,r=abcSERVER,p={}", b64(&[0u8; 64]))), "wrong length");
        expect_malformed(final_result("c=biws,r=abcSERVER,p=not base64!"), "base64");
        expect_malformed(final_result(&format!("c=biws,r=abcSERVER,p=x,p={proof}")), "duplicate");
        expect_malformed(final_result(&format!("c=biws,r=abcSERVER,bad,p={proof}")), "key=value");
        // A well-formed final message with an ignored extension and a wrong proof.
        assert_eq!(final_result(&format!("c=biws,r=abcSERVER,x=y,p={proof}")), Err(ScramError::BadCredentials));
    }

    #[test]
    fn size_and_encoding_limits() {
        let mut big = b"n,,n=alice,r=".to_vec();
        big.resize(MAX_MESSAGE_LEN + 1, b'a');
        let mut server = ScramServer::new(ScramMechanism::Sha256, FAKE_KEY);
        expect_malformed(server.step(&big, |_| None), "too large");

        let mut server = ScramServer::new(ScramMechanism::Sha256, FAKE_KEY);
        expect_malformed(server.step(b"n,,n=al\xffice,r=abc", |_| None), "UTF-8");

        // Just under the limit is accepted (the nonce is long but valid).
        let mut ok = b"n,,n=alice,r=".to_vec();
        ok.resize(MAX_MESSAGE_LEN, b'a');
        let mut server = ScramServer::new(ScramMechanism::Sha256, FAKE_KEY);
        continue_bytes(server.step(&ok, |_| None));

        expect_malformed(final_result(&"x".repeat(MAX_MESSAGE_LEN + 1)), "too large");
        let mut server = ScramServer::new(ScramMechanism::Sha256, FAKE_KEY);
        continue_bytes(server.step(b"n,,n=alice,r=abc", |_| None));
        expect_malformed(server.step(b"c=biws,r=abc\xff,p=AAAA", |_| None), "UTF-8");
    }

    #[test]
    fn steps_after_the_end_are_out_of_order() {
        let mech = ScramMechanism::Sha256;
        let client = Client::new(mech, "alice", "pw", "abc");
        let mut server = ScramServer::new(mech, FAKE_KEY);
        let server_first = continue_bytes(server.step(&client.first(), lookup_for("alice", cred(mech, "pw"))));
        let (client_final, _) = client.finish(&server_first);
        assert!(matches!(server.step(&client_final, |_| None), Ok(ScramStep::Done { .. })));
        assert_eq!(server.step(&client_final, |_| None), Err(ScramError::OutOfOrder));
        assert_eq!(server.step(&client.first(), |_| None), Err(ScramError::OutOfOrder));

        // A failed final step also ends the exchange: the proof cannot be retried.
        let bad = Client::new(mech, "alice", "nope", "abc");
        let mut server = ScramServer::new(mech, FAKE_KEY);
        let server_first = continue_bytes(server.step(&bad.first(), lookup_for("alice", cred(mech, "pw"))));
        let (bad_final, _) = bad.finish(&server_first);
        assert_eq!(server.step(&bad_final, |_| None), Err(ScramError::BadCredentials));
        assert_eq!(server.step(&bad_final, |_| None), Err(ScramError::OutOfOrder));
    }

    #[test]
    fn debug_hides_secrets() {
        let server = ScramServer::new(ScramMechanism::Sha512, [0xAB; 32]);
        let shown = format!("{server:?}");
        assert!(shown.contains("Sha512") && shown.contains("awaiting client-first"));
        assert!(!shown.contains("171"), "fake key leaked: {shown}");
    }

    #[test]
    fn plain_parsing() {
        assert_eq!(parse_plain(b"\0alice\0pw").unwrap(), ("alice".to_owned(), b"pw".to_vec()));
        assert_eq!(parse_plain(b"alice\0alice\0pw").unwrap(), ("alice".to_owned(), b"pw".to_vec()));
        assert_eq!(parse_plain(b"\0alice\0p\xffw").unwrap(), ("alice".to_owned(), b"p\xffw".to_vec()));
        let malformed_cases: [&[u8]; 10] = [
            b"",
            b"alice",
            b"\0alice",
            b"\0alice\0",
            b"\0\0pw",
            b"bob\0alice\0pw",
            b"\0alice\0pw\0",
            b"\0alice\0pw\0extra",
            b"\0al\xffice\0pw",
            b"\xff\0alice\0pw",
        ];
        for case in malformed_cases {
            assert!(matches!(parse_plain(case), Err(ScramError::Malformed(_))), "{case:?} accepted");
        }
        let mut big = b"\0alice\0".to_vec();
        big.resize(MAX_MESSAGE_LEN + 1, b'p');
        assert!(matches!(parse_plain(&big), Err(ScramError::Malformed(_))));
    }

    #[test]
    fn password_verification() {
        for mech in ScramMechanism::ALL {
            let credential = cred(mech, "hunter2");
            assert!(verify_password(mech, &credential, b"hunter2"));
            assert!(!verify_password(mech, &credential, b"hunter3"));
            assert!(!verify_password(mech, &credential, b""));
        }
        // A credential checked with the wrong mechanism never matches.
        let credential = cred(ScramMechanism::Sha256, "hunter2");
        assert!(!verify_password(ScramMechanism::Sha512, &credential, b"hunter2"));
    }

    #[test]
    fn credentials_from_passwords() {
        for mech in ScramMechanism::ALL {
            let a = credential_from_password(mech, b"pw", 4100);
            let b = credential_from_password(mech, b"pw", 4100);
            assert_eq!(a.salt.len(), 32);
            assert_ne!(a.salt, b.salt);
            assert_ne!(a.stored_key, b.stored_key);
            assert_eq!(a.iterations, 4100);
            assert_eq!(a.stored_key.len(), mech.hash_len());
            assert_eq!(a.server_key.len(), mech.hash_len());
            let salted = salted_password(mech, b"pw", &a.salt, 4100);
            assert_eq!(credential_from_salted(mech, &salted, &a.salt, 4100), a);
        }
    }

    #[test]
    fn mechanism_names_and_codes() {
        assert_eq!(ScramMechanism::Sha256.name(), "SCRAM-SHA-256");
        assert_eq!(ScramMechanism::Sha512.name(), "SCRAM-SHA-512");
        assert_eq!(ScramMechanism::from_name("SCRAM-SHA-256"), Some(ScramMechanism::Sha256));
        assert_eq!(ScramMechanism::from_name("SCRAM-SHA-512"), Some(ScramMechanism::Sha512));
        assert_eq!(ScramMechanism::from_name("scram-sha-256"), None);
        assert_eq!(ScramMechanism::from_name("PLAIN"), None);
        assert_eq!(ScramMechanism::Sha256.kafka_code(), 1);
        assert_eq!(ScramMechanism::Sha512.kafka_code(), 2);
        assert_eq!(ScramMechanism::from_kafka_code(1), Some(ScramMechanism::Sha256));
        assert_eq!(ScramMechanism::from_kafka_code(2), Some(ScramMechanism::Sha512));
        assert_eq!(ScramMechanism::from_kafka_code(0), None);
        assert_eq!(ScramMechanism::from_kafka_code(-1), None);
        assert_eq!(ScramMechanism::ALL, [ScramMechanism::Sha256, ScramMechanism::Sha512]);
    }

    /// Feeds random and mutated messages to both steps and to PLAIN. Nothing may panic, and whatever comes out must
    /// be one of the expected outcomes.
    #[test]
    fn fuzz_does_not_panic() {
        let mut rng = StdRng::seed_from_u64(0x5c7a_u64);
        let seeds: [&[u8]; 4] = [
            b"n,,n=alice,r=abc",
            b"n,a=a=2Cb,n=a=2Cb,r=abc,tokenauth=false",
            b"c=biws,r=abcSERVER,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
            b"\0alice\0password",
        ];
        let alphabet = b",=nrcpmay\0abcSERVER2C3D+/";
        let random_message = |rng: &mut StdRng| -> Vec<u8> {
            let mut message = match rng.gen_range(0..3) {
                0 => (0..rng.gen_range(0..80)).map(|_| rng.gen::<u8>()).collect(),
                1 => (0..rng.gen_range(0..80)).map(|_| alphabet[rng.gen_range(0..alphabet.len())]).collect(),
                _ => seeds[rng.gen_range(0..seeds.len())].to_vec(),
            };
            for _ in 0..rng.gen_range(0..4) {
                if message.is_empty() {
                    break;
                }
                let at = rng.gen_range(0..message.len());
                match rng.gen_range(0..3) {
                    0 => message[at] = alphabet[rng.gen_range(0..alphabet.len())],
                    1 => {
                        message.remove(at);
                    }
                    _ => message.insert(at, rng.gen()),
                }
            }
            message
        };

        let credential = cred(ScramMechanism::Sha256, "pw");
        for _ in 0..5000 {
            let mech = ScramMechanism::ALL[rng.gen_range(0..2)];
            let mut server = ScramServer::with_nonce(mech, FAKE_KEY, "SERVER".to_owned());
            let first = random_message(&mut rng);
            let known = rng.gen_bool(0.5);
            let result = server.step(&first, |_| known.then(|| credential.clone()));
            if let Ok(ScramStep::Continue(reply)) = &result {
                assert!(std::str::from_utf8(reply).is_ok());
            }
            let second = random_message(&mut rng);
            let result2 = server.step(&second, |_| None);
            match (&result, &result2) {
                (Err(_), r) => assert_eq!(r, &Err(ScramError::OutOfOrder)),
                (Ok(_), Ok(ScramStep::Done { .. })) => panic!("random proof accepted: {second:?}"),
                _ => {}
            }
            assert_eq!(server.step(&second, |_| None), Err(ScramError::OutOfOrder));
            let _ = parse_plain(&first);
        }
    }
}
