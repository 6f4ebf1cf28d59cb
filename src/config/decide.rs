//! The decision endpoints' settings (`DECIDE_PORT`, `DECIDE_TOKEN`), into [`DecideSettings`];
//! and the bearer tokens (`DECIDE_TOKEN`, `ADMIN_TOKEN`).

use std::net::SocketAddr;

use super::answers::Answers;
use super::env::Env;
use super::{ConfigError, MIN_TOKEN_LENGTH};
use crate::decide::{DecideSettings, Token};
use crate::variables::{self as vars, Var};

/// The decision endpoints' settings on `listen` (`None` without `DECIDE_PORT`), answering with
/// `answers`; `shared_store`: budgets live in Redis, shared by replicas.
pub(crate) fn parse(
    env: &Env,
    listen: Option<SocketAddr>,
    answers: &Answers,
    shared_store: bool,
) -> Result<Option<DecideSettings>, ConfigError> {
    let Some(listen) = listen else {
        return Ok(None);
    };
    // `/v1/check`'s named keys (`{"rule","key"}`) are digested too: replicas sharing Redis
    // must digest them alike, or each holds a budget of its own for one client.
    if shared_store && !env.is_set(vars::KEY_HASH_SECRET) {
        return Err(ConfigError::Missing {
            var: vars::KEY_HASH_SECRET.name,
            expected: "with Redis and DECIDE_PORT, every replica must digest /v1/check's named keys \
                       ({\"rule\",\"key\"}) alike: set the same secret of 16+ characters on each, e.g. \
                       from `openssl rand -hex 32`",
        });
    }
    Ok(Some(DecideSettings {
        listen,
        token: bearer_token(env, vars::DECIDE_TOKEN)?,
        headers: answers.headers,
        refusals: answers.refusals.clone(),
        forward_headers: answers.forward_headers,
        body_timeout: env.millis(vars::BODY_IDLE_TIMEOUT_MS)?,
        access_log: answers.access_log,
    }))
}

/// The bearer token in `var` (`DECIDE_TOKEN`, `ADMIN_TOKEN`): `None` when unset; refused when
/// shorter than [`MIN_TOKEN_LENGTH`].
pub(crate) fn bearer_token(env: &Env, var: Var) -> Result<Option<Token>, ConfigError> {
    match env.get(var) {
        None => Ok(None),
        Some(token) if token.len() < MIN_TOKEN_LENGTH => Err(ConfigError::InvalidSecret {
            var: var.name,
            expected: format!(
                "a secret of at least {MIN_TOKEN_LENGTH} characters (e.g. `openssl rand -hex 32`)"
            ),
        }),
        Some(token) => Token::new(token)
            .map(Some)
            .ok_or_else(|| ConfigError::InvalidSecret {
                var: var.name,
                expected: "a secret to keep: the operating system gave no randomness to keep it with".into(),
            }),
    }
}
