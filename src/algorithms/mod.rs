//! The rate-limiting algorithms, one module each.
//!
//! An algorithm is one type implementing [`Algorithm`]: its parameters, how they are parsed
//! from the two numbers a rule is written with, its pure decision function, its refund, its
//! Lua script (`scripts/<name>.lua`, the same function line for line) with the Redis key
//! suffix and arguments, and how its state is written to and read from the state file. The
//! in-memory store, the Redis store, the state file, the configuration's names and the tests
//! all go through that one definition. Time is an integer count of microseconds since the Unix
//! epoch (the memory store's clock is anchored there too, so fixed windows align alike in both
//! stores).
//!
//! Adding an algorithm is one Rust file and one Lua file, plus its line in the
//! `algorithms!` list below, which declares its module and generates [`Policy`] and [`State`].

mod codec;
pub mod cost;
pub mod decision;

use crate::variables::Var;
use std::fmt;
use std::time::Duration;

pub use codec::{Corrupt, StateReader, put_u32, put_u64};
pub use concurrent::ConcurrentState;
pub use cost::{Cost, CostError};
pub use decision::{Decision, LimitDecision, MAX_LIMITS, Part, Parts, PartsIter};
pub use fixed_window::FixedWindowState;
pub use sliding_log::SlidingLogState;
pub use sliding_window::WindowState;

/// An algorithm's Lua script: its source, and the SHA1 `EVALSHA` names it by.
#[derive(Debug)]
pub struct LuaScript {
    source: &'static str,
    /// The SHA1, in hex.
    hash: String,
}

impl LuaScript {
    /// The script whose text is `source`.
    pub fn new(source: &'static str) -> LuaScript {
        LuaScript {
            source,
            hash: redis::Script::new(source).get_hash().to_owned(),
        }
    }

    /// The script's text, for `EVAL` when a node has not cached it.
    pub fn source(&self) -> &'static str {
        self.source
    }

    /// Its SHA1 in hex, for `EVALSHA`.
    pub fn hash(&self) -> &str {
        &self.hash
    }
}

/// One script that decides several requests in one call, each under one limit or several:
/// every algorithm's script (`scripts/*.lua`, unchanged) wrapped as a Lua function of its
/// `KEYS` and `ARGV`, run in turn for each key. For the i-th key `ARGV` holds seven values
/// from `(i - 1) * 7 + 1`: the algorithm's [`Policy::script_index`] (plus
/// [`BATCH_CONTINUED`] when another key of the same request follows: a request under a rule
/// of several limits has a key for each, one after the other) and its script's six
/// arguments; no argument more for a request of one limit, each of which Redis would parse.
/// The reply has an entry per key. One `TIME` serves every decision that does not pin its clock.
///
/// A request of several limits is decided in one step: when any limit refuses it (or fails),
/// every limit that allowed it refunds its cost at once (the time it counted it at, as its
/// reply says) and its entry is what it has left then (its script run with a cost of 0 at the
/// same now), so a refused request spends nothing
/// in any limit, exactly as the memory store decides. A decision that fails (a key of the
/// wrong type, say) is its own entry, the error's text, and not the call's: the others in the
/// call are decided all the same.
pub fn batch_script() -> &'static LuaScript {
    static BATCH: std::sync::LazyLock<LuaScript> = std::sync::LazyLock::new(|| {
        let mut source = String::from("local algorithms = {}\n");
        for (index, script) in Policy::scripts().enumerate() {
            source.push_str(&format!(
                "algorithms[{index}] = function(KEYS, ARGV)\n{}\nend\n",
                script.source()
            ));
        }
        source.push_str(BATCH_LOOP);
        // Built once per process, and a script's text lives as long as the process anyway.
        LuaScript::new(Box::leak(source.into_boxed_str()))
    });
    &BATCH
}

/// Every script of [`batch_script`], [`peek_script`] and each algorithm's, as one Redis 7
/// function library (`FUNCTION LOAD` once per Redis node, then `FCALL` per decision): the
/// algorithms' code is compiled once when it loads, not rebuilt with the batch script's
/// closures on every call. The library's name, `tollgate_` and the first 12 hex digits of
/// the SHA1 of its code, names its version: every function in it carries that name too
/// (Redis function names are global across libraries), so replicas of two versions of
/// tollgate (a rolling upgrade) each call their own, side by side on one Redis.
///
/// Its functions, for the algorithm of [`Policy::script_index`] `i`:
/// - `<library>_d<i>`: a decision on Redis's clock, `KEYS[1]` the client's key: the
///   algorithm's lean decision ([`Algorithm::LEAN`]: the token bucket's and the sliding
///   window's, its [`Algorithm::lean_arguments`] and the deadline), or else its script with
///   `ARGV` the algorithm's two numbers, the cost and the deadline (µs on the Redis clock, or
///   `""`): the script's six arguments less the two a decision leaves empty, each of which
///   Redis would parse;
/// - `<library>_s<i>`: the algorithm's script with its six arguments (a refund, a charge, a
///   renewal, a pinned clock);
/// - `<library>_lean`: decisions on Redis's clock, several requests' and each request's
///   limits, whose every algorithm has a lean decision ([`LEAN_FUNCTIONS`]);
/// - `<library>_batch` and `<library>_peek`: [`batch_script`] and [`peek_script`];
/// - `<library>_lease`: [`LEASE_TAKE`], a hot key's share of its budget.
#[derive(Debug)]
pub struct FunctionLibrary {
    /// The code for `FUNCTION LOAD REPLACE`, `#!lua name=<library>` first.
    source: String,
    /// `<library>_d<i>` for each algorithm, in [`Policy::script_index`] order.
    decide: Vec<String>,
    /// `<library>_s<i>` for each algorithm.
    script: Vec<String>,
    /// `<library>_lean`.
    lean: String,
    /// `<library>_batch`.
    batch: String,
    /// `<library>_peek`.
    peek: String,
    /// `<library>_lease`.
    lease: String,
}

impl FunctionLibrary {
    /// The code to load (`FUNCTION LOAD REPLACE <source>`).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The library's name, `tollgate_<version>`.
    pub fn name(&self) -> &str {
        self.batch.trim_end_matches("_batch")
    }

    /// The function deciding under the algorithm of script index `index` on Redis's clock: its
    /// lean decision, or its script with four arguments.
    pub fn decide(&self, index: usize) -> &str {
        self.decide.get(index).map_or("", String::as_str)
    }

    /// The function running the algorithm's script with its six arguments.
    pub fn script(&self, index: usize) -> &str {
        self.script.get(index).map_or("", String::as_str)
    }

    /// The lean batch: decisions on Redis's clock whose every limit has a lean decision
    /// ([`LEAN_FUNCTIONS`]' `lean_batch`).
    pub fn lean(&self) -> &str {
        &self.lean
    }

    /// The function of [`batch_script`].
    pub fn batch(&self) -> &str {
        &self.batch
    }

    /// The function of [`peek_script`].
    pub fn peek(&self) -> &str {
        &self.peek
    }

    /// The function of [`LEASE_TAKE`].
    pub fn lease(&self) -> &str {
        &self.lease
    }
}

/// The take of a hot key's share of its budget under each of its limits (`stores::lease`;
/// the arithmetic in docs/algorithms.md, "Leases"): each algorithm's state read as its own
/// script reads it, so it lives with them.
pub const LEASE_TAKE: &str = include_str!("../../scripts/lease_take.lua");

/// The [`FunctionLibrary`], built once per process.
pub fn function_library() -> &'static FunctionLibrary {
    static LIBRARY: std::sync::LazyLock<FunctionLibrary> = std::sync::LazyLock::new(|| {
        let mut body = String::from("local algorithms = {}\n");
        let mut count = 0;
        for (index, script) in Policy::scripts().enumerate() {
            body.push_str(&format!(
                "algorithms[{index}] = function(KEYS, ARGV)\n{}\nend\n",
                script.source()
            ));
            count = index + 1;
        }
        // The lean decisions are part of the body, so of the library's version.
        body.push_str(LEAN_PRELUDE);
        body.push_str("local leans = {}\n");
        for (index, lean) in Policy::leans().enumerate() {
            if let Some(lean) = lean {
                body.push_str(&format!("leans[{index}] = (function()\n{lean}\nend)()\n"));
            }
        }
        body.push_str(&format!(
            "local function batch(KEYS, ARGV)\n{BATCH_LOOP}\nend\n\
             local function peek(KEYS, ARGV)\n{PEEK_BODY}\nend\n\
             local function lease(KEYS, ARGV)\n{LEASE_TAKE}\nend\n\
             {LEAN_FUNCTIONS}"
        ));
        let version = redis::Script::new(&body).get_hash().to_owned();
        let name = format!("tollgate_{}", &version[..12]);
        let decide: Vec<String> = (0..count).map(|i| format!("{name}_d{i}")).collect();
        let script: Vec<String> = (0..count).map(|i| format!("{name}_s{i}")).collect();
        let mut source = format!("#!lua name={name}\n{body}");
        for (index, lean) in Policy::leans().enumerate().take(count) {
            source.push_str(&format!(
                "local run{index} = algorithms[{index}]\nredis.register_function('{}', run{index})\n",
                script[index]
            ));
            match lean {
                // The algorithm's own lean decision.
                Some(_) => source.push_str(&format!(
                    "redis.register_function('{}', lean_decision(leans[{index}]))\n",
                    decide[index]
                )),
                // A decision: the script's arguments with an empty clock and call put back.
                None => source.push_str(&format!(
                    "redis.register_function('{}', function(keys, args)\n  \
                     return run{index}(keys, {{args[1], args[2], args[3], '', '', args[4]}})\nend)\n",
                    decide[index]
                )),
            }
        }
        source.push_str(&format!(
            "redis.register_function('{name}_batch', batch)\n\
             redis.register_function('{name}_peek', peek)\n\
             redis.register_function('{name}_lease', lease)\n\
             redis.register_function('{name}_lean', lean_batch)\n"
        ));
        FunctionLibrary {
            source,
            decide,
            script,
            lean: format!("{name}_lean"),
            batch: format!("{name}_batch"),
            peek: format!("{name}_peek"),
            lease: format!("{name}_lease"),
        }
    });
    &LIBRARY
}

/// One script that reads a client's budget without spending any of it, for the admin's
/// `GET /v1/clients/RULE/KEY`: for each of the rule's limits, the algorithm's own script (the
/// same functions as [`batch_script`], so one definition still serves memory and Redis) run
/// with a cost of 0 between a `DUMP` of the key and its `RESTORE` (or `DEL`, for a key that was
/// not there), so nothing the script tidied or created outlives the call. `KEYS` the client's
/// key under each limit; for the i-th, `ARGV` from `(i - 1) * 3 + 1` the algorithm's
/// [`Policy::script_index`] and its two parameters. The reply has a decision for each key, as
/// the algorithm's script gives it.
pub fn peek_script() -> &'static LuaScript {
    static PEEK: std::sync::LazyLock<LuaScript> = std::sync::LazyLock::new(|| {
        let mut source = String::from("local algorithms = {}\n");
        for (index, script) in Policy::scripts().enumerate() {
            source.push_str(&format!(
                "algorithms[{index}] = function(KEYS, ARGV)\n{}\nend\n",
                script.source()
            ));
        }
        source.push_str(PEEK_BODY);
        LuaScript::new(Box::leak(source.into_boxed_str()))
    });
    &PEEK
}

/// The body of [`peek_script`], after the algorithms' functions.
const PEEK_BODY: &str = r#"
local replies = {}
for i = 1, #KEYS do
  local at = (i - 1) * 3
  local snapshot = redis.call('DUMP', KEYS[i])
  local ttl = redis.call('PTTL', KEYS[i])
  replies[i] = algorithms[tonumber(ARGV[at + 1])]({KEYS[i]}, {ARGV[at + 2], ARGV[at + 3], '0', '', '', ''})
  if snapshot then
    -- PTTL -1: no expiry (RESTORE's 0); a key about to expire keeps a millisecond.
    if ttl == -1 then ttl = 0 elseif ttl < 1 then ttl = 1 end
    redis.call('RESTORE', KEYS[i], ttl, snapshot, 'REPLACE')
  else
    redis.call('DEL', KEYS[i])
  end
end
return replies
"#;

/// Added to an algorithm's index in [`batch_script`]'s arguments when another key of the same
/// request follows.
pub const BATCH_CONTINUED: usize = 100;

/// What the lean parts share, defined before them in the [`function_library`]: `whole(value)`,
/// a stored value as a whole number in [0, 2^53), else `nil`. Lua's `tonumber` also takes
/// `"2.5"`, `"nan"`, `"inf"` or `"1e300"`, which a lean part would decide on as they are while
/// Redis hands the gateway other integers for them (a `long long` cast), and the gateway
/// decides on what it is handed: the two would disagree, and a request refused in Lua (so never
/// counted) be allowed by the gateway. So a lean part reads nothing else as a number. And
/// `placed(key, now, w)`, where the windows (fixed and sliding) count now: never before the
/// newest window counted, `:w`.
pub(crate) const LEAN_PRELUDE: &str = r#"
local function whole(value)
  local v = tonumber(value)
  if v and v >= 0 and v < 9007199254740992 and v == math.floor(v) then
    return v
  end
end
-- A window of w ms that counts in `key .. ':' .. index`: the index of the window now falls in,
-- never before the newest one counted (`key .. ':w'`, where a clock that stepped back counts),
-- then `:w` as read (nil: none) and now in ms as placed so.
local function placed(key, now, w)
  local sw = whole(redis.call('GET', key .. ':w'))
  local now_ms = math.floor(now / 1000)
  if sw and sw * w > now_ms then
    now_ms = sw * w
  end
  return math.floor(now_ms / w), sw, now_ms
end
"#;

/// The functions that drive the algorithms' lean parts ([`Algorithm::LEAN`], `leans[i]` for
/// the algorithm of [`Policy::script_index`] `i`), defined after them in the
/// [`function_library`]:
/// - `lean_decision(lean)`: the function deciding one request under that one limit,
///   `<library>_d<i>`: `KEYS[1]` the client's key, `ARGV` the algorithm's
///   [`lean_arguments`](Algorithm::lean_arguments) (its parameters, then the cost) then the
///   deadline (µs on the Redis clock, or `""`); the reply is one string, `"now ..."`: the
///   Redis time and the numbers the algorithm's `decide` gives for it, in decimal, one space
///   apart (a table would cost Redis more to convert).
/// - `lean_batch`: several requests, each under one limit or several, in one call
///   (`<library>_lean`): `KEYS` every request's keys, a request's consecutive; `ARGV[1]` the
///   deadline; `ARGV[2]` how many limits the call's requests are under, then each of them once:
///   its algorithm's index and its parameters (all but the last of its lean arguments); then
///   for each key the number of its limit among those (from 1, negative when another key of
///   the same request follows) and the cost (the last lean argument): a hot rule's numbers are
///   sent and parsed once a call, not once a key, as each argument costs Redis about a
///   command's parsing. One `TIME` for all;
///   each key read once and written once, at the end, however many decisions it takes part
///   in (the call is atomic, so its decisions are those one call each would make in turn at
///   that time). A request is allowed when every limit allows it, and only then does any limit
///   count it, so a refused request spends nothing (the gateway works out what an allowing
///   limit has left with a cost of 0). The reply is flat, one table however many keys (each
///   table Redis converts costs it as much as a command's arguments): the Redis time, then for
///   each key the count of its algorithm's reply numbers and those numbers, or in the count's
///   place an error's text for a key that could not be read (a key of another type: its
///   request is not decided, the others are); `{-1, now}` past the deadline, when nothing is
///   read or written.
pub const LEAN_FUNCTIONS: &str = r#"
-- A lean decision's reply, the Redis time and the `count` numbers of the state it decided
-- from, as one string of digits and spaces: Redis turns a string into a reply for less than a
-- table (whose every field it reads through the Lua API, and looks for `err` and `ok` in).
local REPLY_FORMATS = {[0] = '%d', '%d %d', '%d %d %d', '%d %d %d %d'}
local function lean_decision(lean)
  local parameters, read, decide, write = lean.parameters, lean.read, lean.decide, lean.write
  local function finish(key, now, next, tidied, count, a, b, c)
    next = next or tidied
    if next then
      write(key, next)
    end
    return string.format(REPLY_FORMATS[count], now, a, b, c)
  end
  return function(KEYS, ARGV)
    local t = redis.call('TIME')
    local now = t[1] * 1000000 + t[2]
    local deadline = tonumber(ARGV[parameters + 2])
    if deadline and now > deadline then
      return {-1, now}
    end
    local key, a, b = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2])
    return finish(key, now, decide(read(key, now, a, b), now, tonumber(ARGV[parameters + 1]), a, b))
  end
end
-- A key's decision from what this call knows of it (nil: not read yet); what it read first.
local function lean_step(lean, key, state, now, cost, a, b)
  if state == nil then
    state = lean.read(key, now, a, b) or false
  end
  return state, lean.decide(state or nil, now, cost, a, b)
end
local function lean_batch(KEYS, ARGV)
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  local deadline = tonumber(ARGV[1])
  if deadline and now > deadline then
    return {-1, now}
  end
  -- The limits, each once: its algorithm's lean parts and its parameters, as numbers.
  local limits, at = {}, 3
  for j = 1, tonumber(ARGV[2]) do
    local lean = leans[tonumber(ARGV[at])]
    limits[j] = {lean, tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])}
    at = at + 1 + lean.parameters
  end
  -- The reply, flat: the time, then for each key the count of its reply's numbers and them
  -- (or the error's text).
  local out, length = {now}, 1
  -- Each key's state as the decisions so far left it (false: none), and the lean parts that
  -- write it at the end.
  local states, writers = {}, {}
  -- The request being decided: its keys so far, the states each would leave, the algorithm
  -- of each, and whether any limit refused it (or failed).
  local keys, nexts, owners, count, refused = {}, {}, {}, 0, false
  for i = 1, #KEYS do
    -- The key's limit, negative when another key of the same request follows, and its cost.
    local j = tonumber(ARGV[at])
    local continued = j < 0
    if continued then
      j = -j
    end
    local limit = limits[j]
    local lean = limit[1]
    local key = KEYS[i]
    -- A key an earlier limit of this request counted in (a rule listing one limit twice)
    -- decides on what that limit would leave.
    local state = states[key]
    for k = 1, count do
      if keys[k] == key then
        state = nexts[k]
      end
    end
    local ok, read, next, tidied, n, a, b, c = pcall(lean_step, lean, key, state, now,
      tonumber(ARGV[at + 1]), limit[2], limit[3])
    if not ok then
      out[length + 1] = type(read) == 'table' and read.err or tostring(read)
      length = length + 1
      refused = true
    else
      if states[key] == nil then
        states[key] = read
      end
      out[length + 1] = n
      if n > 0 then
        out[length + 2] = a
        if n > 1 then
          out[length + 3], out[length + 4] = b, c
        end
      end
      length = length + 1 + n
      if next then
        count = count + 1
        keys[count], nexts[count], owners[count] = key, next, lean
      else
        refused = true
      end
      if tidied then
        states[key], writers[key] = tidied, lean
      end
    end
    at = at + 2
    if not continued then
      if not refused then
        for k = 1, count do
          states[keys[k]], writers[keys[k]] = nexts[k], owners[k]
        end
      end
      count, refused = 0, false
    end
  end
  for key, lean in pairs(writers) do
    lean.write(key, states[key])
  end
  return out
end
"#;

/// The loop of [`batch_script`], after the algorithms' functions.
const BATCH_LOOP: &str = r#"
local clock
local replies = {}
-- The key's `now`: pinned, or the one `TIME` of the call.
local function now_of(i)
  local now = ARGV[(i - 1) * 7 + 5]
  if now ~= '' then
    return now
  end
  if not clock then
    local t = redis.call('TIME')
    clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return clock
end
-- The i-th key's algorithm with these arguments; a failure is the reply's text.
local function call(i, cost, now, refund_at, deadline)
  local at = (i - 1) * 7
  local ok, reply = pcall(algorithms[tonumber(ARGV[at + 1]) % 100], {KEYS[i]},
    {ARGV[at + 2], ARGV[at + 3], cost, now, refund_at, deadline})
  if ok then
    return reply
  elseif type(reply) == 'table' and reply.err then
    return reply.err
  end
  return tostring(reply)
end
-- A request of several limits, keys first to last: unless every limit allowed it, each that
-- did gives its cost back at once and says what it has left, so a refused request spends
-- nothing in any.
local function settle(first, last)
  for k = first, last do
    local reply = replies[k]
    if type(reply) ~= 'table' or reply[1] ~= 1 then
      for j = first, last do
        local allowed = replies[j]
        if type(allowed) == 'table' and allowed[1] == 1 then
          local given = call(j, ARGV[(j - 1) * 7 + 4], now_of(j), allowed[5], '')
          if type(given) == 'table' or given == 1 then
            replies[j] = call(j, '0', now_of(j), '', '')
          else
            replies[j] = given
          end
        end
      end
      return
    end
  end
end
-- The first key of the request being decided: a request's keys are consecutive.
local first = 1
for i = 1, #KEYS do
  local at = (i - 1) * 7
  -- An index of 100 or more: another key of the same request follows.
  local index = tonumber(ARGV[at + 1])
  local continued = index >= 100
  if continued then
    index = index - 100
  end
  local now = ARGV[at + 5]
  if now == '' then
    now = now_of(i)
  end
  local ok, reply = pcall(algorithms[index], {KEYS[i]},
    {ARGV[at + 2], ARGV[at + 3], ARGV[at + 4], now, ARGV[at + 6], ARGV[at + 7]})
  if ok then
    replies[i] = reply
  elseif type(reply) == 'table' and reply.err then
    replies[i] = reply.err
  else
    replies[i] = tostring(reply)
  end
  if not continued then
    if i > first and ARGV[at + 6] == '' then
      settle(first, i)
    end
    first = i + 1
  end
end
return replies
"#;

/// Numbers that cross into Lua (where they are doubles, exact below 2^53) stay below 2^50,
/// which leaves room for the additions the scripts make. Parameter parsers enforce it.
pub const EXACT_LIMIT: u64 = 1 << 50;

/// How many limits' worth a client's state may hold spent after a charge: its limit, and one
/// more of debt (see [`Algorithm::charge`]).
pub const DEBT_LIMITS: u64 = 2;

/// One rate-limiting algorithm: parameters plus a pure function of (state, now, cost).
pub trait Algorithm: Copy + PartialEq + fmt::Debug + fmt::Display + Send + Sync + 'static {
    /// What a store remembers of one client under one rule. `Default` is a client never seen,
    /// whose whole budget is available.
    type State: Clone + Default + PartialEq + fmt::Debug + Send + 'static;

    /// The name in `ALGORITHM`, `AUTH_ALGORITHM` and `ROUTES`.
    const NAME: &'static str;
    /// Other names accepted for the same algorithm.
    const ALIASES: &'static [&'static str] = &[];
    /// The two numbers a rule of this algorithm is written with, in order, and the variables
    /// `ALGORITHM` (`AUTH_ALGORITHM`) reads them from; `None` for a kind only a limit list
    /// writes (`concurrent`).
    const PARAMETERS: Option<[Parameter; 2]>;
    /// What each of the two numbers is, in a few words, for errors.
    const MEANINGS: [&'static str; 2] = match Self::PARAMETERS {
        Some([first, second]) => [first.meaning, second.meaning],
        None => ["", ""],
    };
    /// Last part of the Redis key, so two algorithms never read each other's state.
    const KEY_SUFFIX: &'static str;
    /// Whether a denial's `retry_after` is exactly when the same request would pass, on a
    /// budget no other request spends meanwhile: what `delay=` sleeps for, so a delayed
    /// request wakes when it can go instead of polling. A limit kind with no such time (a cap
    /// on requests in flight, freed when one ends rather than at an instant) says no, and a
    /// delay on it is refused at start. The property tests retry at `now + retry_after` and
    /// demand an allowed decision.
    const EXACT_RETRY: bool;
    /// The algorithm's tag in the state file (`STATE_FILE`): its own for good, never another
    /// algorithm's, so adding one or reordering the list never changes what a saved file
    /// means. The registry's test demands they differ.
    const FILE_TAG: u8;
    /// Policies the tests drive every algorithm with (the hostile-cost properties, the
    /// registry's round trips, the memory-against-Redis differential test): small numbers, and
    /// the largest the configuration accepts.
    const EXAMPLES: &'static [Self];

    /// The Lua script: `KEYS[1]` the client's key; `ARGV` the two [`script_arguments`], the
    /// cost, now in µs (or `""` to read Redis `TIME`), `""` to decide or the decision's time
    /// in µs to refund, and the call's deadline in µs on the Redis clock (or `""` for none).
    /// A decision returns `{allowed 1|0, remaining, retry_after_us, reset_after_us, now_us}`;
    /// a call whose deadline had passed changes nothing and returns `{-1, now_us}`.
    ///
    /// [`script_arguments`]: Algorithm::script_arguments
    fn script() -> &'static LuaScript;

    /// The lean decision (`scripts/<name>_decide.lua`), for the hot path only: decisions on
    /// Redis's clock, alone (the library's `<library>_d<i>`) and in batches
    /// (`<library>_lean`), see [`LEAN_FUNCTIONS`]. A Lua chunk returning the algorithm's lean
    /// parts: `parameters`, how many of its [`lean_arguments`](Algorithm::lean_arguments) the
    /// rule gives (at most two; the last argument is the cost); `read(key, now, ...)` (the
    /// parameters after `now`), the state stored as it stands at `now`;
    /// `decide(state, now, cost, ...)` (numbers, the parameters after the cost): the state to
    /// store when allowed, one to store even when refused, then the count of the reply's
    /// numbers after the Redis time and those numbers (the state the decision started from,
    /// for [`lean_decision`](Algorithm::lean_decision)); `write(key, state)`. What it stores
    /// is what [`script`](Algorithm::script) stores. `None`: the library's wrapper runs the full script
    /// instead (four arguments, its five-number reply), and batches with it run the full scripts.
    const LEAN: Option<&'static str> = None;

    /// The lean decision's arguments before the deadline, for a request of `cost`: the
    /// parameters (numbers the gateway can work out once, sent worked out), then the cost
    /// clamped as the scripts clamp it. Only called for an algorithm with
    /// [`LEAN`](Algorithm::LEAN).
    fn lean_arguments(&self, _cost: u64) -> LeanArguments {
        LeanArguments::default()
    }

    /// The decision of a request of `cost` from the lean function's reply: the Redis time it
    /// decided at and the state it read (`state`, after the time). The same function as the
    /// memory store's, run on what the script read; `None` for a reply it could not have meant.
    fn lean_decision(&self, _now_us: u64, _state: &[u64], _cost: u64) -> Option<LimitDecision> {
        None
    }

    /// Build from the two numbers as written (already trimmed).
    fn from_parameters(first: &str, second: &str) -> Result<Self, ParameterError>;

    /// `ARGV[1]` and `ARGV[2]` of the script; the state file records them too.
    fn script_arguments(&self) -> [u64; 2];

    /// The policy whose [`script_arguments`](Algorithm::script_arguments) are `arguments`,
    /// unchecked: the state file names a saved limit by them, only to compare it with the
    /// rules'.
    fn from_script_arguments(arguments: [u64; 2]) -> Self;

    /// The quota a client is told about (`X-RateLimit-Limit`, `q=`): burst capacity or
    /// requests per window.
    fn limit(&self) -> u64;

    /// The time over which [`limit`](Algorithm::limit) applies (`w=`): the window, or the
    /// time to refill an empty bucket.
    fn window(&self) -> Duration;

    /// Decide a request of `cost` at `now_us`, updating `state` when it is allowed. A denial
    /// consumes nothing: the state may only be tidied (expired entries dropped), never changed
    /// in a way a later decision could see. Total over every `u64`: a cost above
    /// [`limit`](Algorithm::limit) is refused at once, before any arithmetic, whatever it is
    /// (the stores hand over a [`Cost`], at most [`Cost::MAX`], so the Lua scripts see no
    /// more), and every sum and product on times and tokens saturates.
    fn check(&self, state: &mut Self::State, now_us: u64, cost: u64) -> LimitDecision;

    /// Give back `cost` taken by an allowed request decided at `at_us`, as if it had never
    /// been made (as far as the state still remembers it).
    fn refund(&self, state: &mut Self::State, at_us: u64, cost: u64);

    /// Spend `cost` at `now_us` whatever is left, past the limit if need be (a cost the
    /// backend reported after the response, `RESPONSE_COST_HEADER`): the budget goes into
    /// debt, and requests are refused until the algorithm's own arithmetic has paid it back.
    /// The debt is bounded: after a charge the state holds at most twice the limit spent (one
    /// capacity or window's limit of debt, [`DEBT_LIMITS`]), so no report, however large,
    /// refuses a client for longer than about two windows or refills. The script's `"charge"`
    /// mode, line for line.
    fn charge(&self, state: &mut Self::State, now_us: u64, cost: u64);
    /// Renew the lease taken by the allowed request decided at `at_us`, as if taken at
    /// `now_us`: what a limit whose count ends with the request ([`Concurrent`]) is told while
    /// the request goes on. The rate algorithms have nothing to renew.
    fn renew(&self, _state: &mut Self::State, _at_us: u64, _now_us: u64) {}

    /// The time (µs) from which forgetting `state` changes no future decision: the budget is
    /// entirely back. The memory store purges states past it and, when full, evicts the one
    /// closest to it (it loses the least).
    fn idle_at(&self, state: &Self::State) -> u64;

    /// True when forgetting `state` at `now_us` changes no future decision.
    fn is_idle(&self, state: &Self::State, now_us: u64) -> bool {
        self.idle_at(state) <= now_us
    }

    /// Append `state` as the state file keeps it (little-endian, [`put_u64`]); false, writing
    /// nothing, for an algorithm whose states are never saved (a concurrency limit's leases
    /// belong to requests of the process that saved them).
    fn save_state(&self, state: &Self::State, out: &mut Vec<u8>) -> bool;

    /// Read back a state [`save_state`](Algorithm::save_state) wrote, checked against what
    /// this algorithm can leave by `saved_at` (µs): a state no decision could have left (a
    /// count over the bounded debt, a window not begun) is the file's corruption, and every
    /// length is bounded by [`StateReader::left`] before anything is allocated.
    fn load_state(&self, input: &mut StateReader<'_>, saved_at: u64) -> Result<Self::State, codec::Corrupt>;
}

/// The arguments of an algorithm's lean decision before its deadline (at most three numbers):
/// [`Algorithm::lean_arguments`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeanArguments {
    values: [u64; 3],
    len: usize,
}

impl LeanArguments {
    /// The arguments `values`, at most three (more are left off: a programming error the
    /// library's tests catch).
    pub fn new(values: &[u64]) -> LeanArguments {
        let mut arguments = LeanArguments::default();
        for (slot, value) in arguments.values.iter_mut().zip(values) {
            *slot = *value;
            arguments.len += 1;
        }
        arguments
    }

    /// The numbers, in order.
    pub fn as_slice(&self) -> &[u64] {
        &self.values[..self.len]
    }
}

/// One number of a rule: the variables it is read from for the general and auth rules, and
/// their defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parameter {
    /// What it is, in a few words (`capacity`, `window seconds`).
    pub meaning: &'static str,
    /// Variable for the general rule (`MAX_TOKENS`), with its default.
    pub general: Var,
    /// Variable for the auth rule (`AUTH_MAX_TOKENS`), with its default.
    pub auth: Var,
}

/// Why a rule's numbers were refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParameterError {
    /// The first or second number (index 0 or 1) is not acceptable; says what is.
    Invalid {
        /// 0 or 1.
        index: usize,
        /// What is accepted.
        expected: String,
    },
    /// Each number is fine alone, but not together (e.g. a refill taking 35 years).
    Combination(String),
}

/// Microseconds in a whole number of milliseconds.
pub(crate) const US_PER_MS: u64 = 1_000;

/// Parse a whole number of at least 1 (and below [`EXACT_LIMIT`]).
pub(crate) fn parse_count(value: &str, index: usize) -> Result<u64, ParameterError> {
    value
        .parse::<u64>()
        .ok()
        .filter(|n| (1..EXACT_LIMIT).contains(n))
        .ok_or_else(|| ParameterError::Invalid {
            index,
            expected: "a whole number of at least 1".into(),
        })
}

/// Parse a window length in seconds (fractions allowed, at least 1 ms, below 10^9 s so the
/// window in microseconds stays below [`EXACT_LIMIT`]) into milliseconds.
pub(crate) fn parse_window_ms(value: &str, index: usize) -> Result<u64, ParameterError> {
    value
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.001 && *s < 1e9)
        .map(|s| (s * 1e3).round() as u64)
        .ok_or_else(|| ParameterError::Invalid {
            index,
            expected: "a window length in seconds: a number from 0.001 to below 1000000000".into(),
        })
}

/// What is done with an algorithm of any type ([`Policy::visit`]).
#[cfg(test)]
pub(crate) trait Visitor {
    /// Do it with `algorithm`.
    fn visit<A: Algorithm>(&mut self, algorithm: A);
}

/// Generates [`Policy`] (an algorithm with its parameters) and [`State`] (what a store keeps)
/// from the list of algorithms, with the dispatch from one to the other.
macro_rules! algorithms {
    ($($variant:ident($module:ident::$algorithm:ident)),+ $(,)?) => {
        $(
            pub mod $module;
            pub use $module::$algorithm;
        )+

        /// An algorithm with its parameters: what a rule enforces.
        #[derive(Debug, Clone, Copy, PartialEq)]
        pub enum Policy {
            $(
                #[doc = concat!("`", stringify!($variant), "`: see [`", stringify!($algorithm), "`].")]
                $variant($algorithm),
            )+
        }

        /// What a store remembers of one client under one rule.
        #[derive(Debug, Clone, PartialEq)]
        pub enum State {
            $(
                #[doc = concat!("State of [`", stringify!($algorithm), "`].")]
                $variant(<$algorithm as Algorithm>::State),
            )+
        }

        impl Policy {
            /// Every kind's canonical name ([`Algorithm::NAME`]), in the order they are declared.
            pub const NAMES: &'static [&'static str] = &[$(<$algorithm as Algorithm>::NAME),+];

            /// Every name a limit may be written with, each kind's [`Algorithm::NAME`] then its
            /// [`Algorithm::ALIASES`], in the order they are declared; `variables`: only the
            /// algorithms `ALGORITHM` may name (those with [`Algorithm::PARAMETERS`]).
            pub fn spellings(variables: bool) -> Vec<&'static str> {
                let mut names = Vec::new();
                $(
                    if !variables || <$algorithm as Algorithm>::PARAMETERS.is_some() {
                        names.push(<$algorithm as Algorithm>::NAME);
                        names.extend_from_slice(<$algorithm as Algorithm>::ALIASES);
                    }
                )+
                names
            }

            /// The algorithm named `name` (or an alias), with its two parameters, as
            /// [`Algorithm::PARAMETERS`]; `None` when no algorithm has that name, or it is
            /// not read from variables.
            pub fn parameters(name: &str) -> Option<[Parameter; 2]> {
                $(
                    if <$algorithm as Algorithm>::NAME == name
                        || <$algorithm as Algorithm>::ALIASES.contains(&name)
                    {
                        return <$algorithm as Algorithm>::PARAMETERS;
                    }
                )+
                None
            }

            /// What the two numbers of the algorithm named `name` are ([`Algorithm::MEANINGS`]).
            pub fn meanings(name: &str) -> Option<[&'static str; 2]> {
                $(
                    if <$algorithm as Algorithm>::NAME == name
                        || <$algorithm as Algorithm>::ALIASES.contains(&name)
                    {
                        return Some(<$algorithm as Algorithm>::MEANINGS);
                    }
                )+
                None
            }

            /// Build the algorithm named `name` from its two numbers; `None` when no algorithm
            /// has that name.
            pub fn parse(name: &str, first: &str, second: &str) -> Option<Result<Policy, ParameterError>> {
                $(
                    if <$algorithm as Algorithm>::NAME == name
                        || <$algorithm as Algorithm>::ALIASES.contains(&name)
                    {
                        return Some(<$algorithm>::from_parameters(first, second).map(Policy::$variant));
                    }
                )+
                None
            }

            /// The algorithm's canonical name.
            pub fn name(&self) -> &'static str {
                match self { $(Policy::$variant(_) => <$algorithm as Algorithm>::NAME),+ }
            }

            /// See [`Algorithm::limit`].
            pub fn limit(&self) -> u64 {
                match self { $(Policy::$variant(a) => a.limit()),+ }
            }

            /// See [`Algorithm::window`].
            pub fn window(&self) -> Duration {
                match self { $(Policy::$variant(a) => a.window()),+ }
            }

            /// See [`Algorithm::KEY_SUFFIX`].
            pub fn key_suffix(&self) -> &'static str {
                match self { $(Policy::$variant(_) => <$algorithm as Algorithm>::KEY_SUFFIX),+ }
            }

            /// A digest of the algorithm and its numbers (FNV-1a of [`Policy`]'s text), the
            /// same in every replica: part of each Redis key, so a rule whose numbers change
            /// on a reload starts afresh rather than reading a state kept under others.
            pub fn fingerprint(&self) -> u32 {
                fnv1a(format_args!("{self}"))
            }

            /// Every algorithm's script, in the order of [`Policy::script_index`].
            pub fn scripts() -> impl Iterator<Item = &'static LuaScript> {
                [$(<$algorithm as Algorithm>::script()),+].into_iter()
            }

            /// Every algorithm's [`Algorithm::LEAN`], in the order of [`Policy::script_index`].
            pub fn leans() -> impl Iterator<Item = Option<&'static str>> {
                [$(<$algorithm as Algorithm>::LEAN),+].into_iter()
            }

            /// The lean decision's arguments before the deadline, `None` for an algorithm
            /// without one (see [`Algorithm::LEAN`]).
            pub fn lean_arguments(&self, cost: Cost) -> Option<LeanArguments> {
                match self {
                    $(Policy::$variant(a) => <$algorithm as Algorithm>::LEAN.map(|_| a.lean_arguments(cost.get()))),+
                }
            }

            /// See [`Algorithm::lean_decision`].
            pub fn lean_decision(&self, now_us: u64, state: &[u64], cost: Cost) -> Option<LimitDecision> {
                match self { $(Policy::$variant(a) => a.lean_decision(now_us, state, cost.get())),+ }
            }

            /// The position of this algorithm's script in [`Policy::scripts`].
            pub fn script_index(&self) -> usize {
                let mut index = 0;
                $(
                    if matches!(self, Policy::$variant(_)) {
                        return index;
                    }
                    index += 1;
                )+
                index
            }

            /// The script and its two parameter arguments.
            pub fn script(&self) -> (&'static LuaScript, [u64; 2]) {
                match self {
                    $(Policy::$variant(a) => (<$algorithm as Algorithm>::script(), a.script_arguments())),+
                }
            }

            /// See [`Algorithm::EXACT_RETRY`].
            pub fn exact_retry(&self) -> bool {
                match self { $(Policy::$variant(_) => <$algorithm as Algorithm>::EXACT_RETRY),+ }
            }

            /// See [`Algorithm::FILE_TAG`].
            pub fn file_tag(&self) -> u8 {
                match self { $(Policy::$variant(_) => <$algorithm as Algorithm>::FILE_TAG),+ }
            }

            /// The policy the state file's tag and numbers name (unchecked: it is only
            /// compared with the rules'); `None` for a tag no algorithm has.
            pub fn from_file(tag: u8, arguments: [u64; 2]) -> Option<Policy> {
                $(
                    if tag == <$algorithm as Algorithm>::FILE_TAG {
                        return Some(Policy::$variant(<$algorithm>::from_script_arguments(arguments)));
                    }
                )+
                None
            }

            /// Every algorithm's [`Algorithm::EXAMPLES`], in the list's order.
            pub fn examples() -> impl Iterator<Item = Policy> {
                std::iter::empty()
                    $(.chain(<$algorithm as Algorithm>::EXAMPLES.iter().copied().map(Policy::$variant)))+
            }

            /// Append `state` for the state file (see [`Algorithm::save_state`]); false,
            /// writing nothing, for a state of another algorithm (which a decision would treat
            /// as a client never seen) or one never saved.
            pub fn save_state(&self, state: &State, out: &mut Vec<u8>) -> bool {
                match (self, state) {
                    $((Policy::$variant(a), State::$variant(s)) => a.save_state(s, out),)+
                    #[allow(unreachable_patterns)]
                    _ => false,
                }
            }

            /// Read back a state of this policy (see [`Algorithm::load_state`]).
            pub fn load_state(&self, input: &mut StateReader<'_>, saved_at: u64) -> Result<State, Corrupt> {
                match self {
                    $(Policy::$variant(a) => a.load_state(input, saved_at).map(State::$variant)),+
                }
            }

            /// Hand the algorithm itself, its type known, to `visitor` (tests that drive an
            /// algorithm's own functions, past [`Policy`]'s).
            #[cfg(test)]
            pub(crate) fn visit(&self, visitor: &mut impl Visitor) {
                match *self { $(Policy::$variant(a) => visitor.visit(a)),+ }
            }

            /// The state of a client never seen.
            pub fn fresh_state(&self) -> State {
                match self { $(Policy::$variant(_) => State::$variant(Default::default())),+ }
            }

            /// See [`Algorithm::check`]. A state of another algorithm (impossible unless the
            /// rule table changed) counts as a client never seen.
            pub fn check(&self, state: &mut State, now_us: u64, cost: Cost) -> LimitDecision {
                let cost = cost.get();
                match (self, &mut *state) {
                    $((Policy::$variant(a), State::$variant(s)) => return a.check(s, now_us, cost),)+
                    #[allow(unreachable_patterns)]
                    _ => {}
                }
                *state = self.fresh_state();
                self.check(state, now_us, Cost::saturating(cost))
            }

            /// What `state` has left at `now_us`, spending nothing: the decision of a request
            /// of cost 0 on a copy (`remaining`, `reset_after`), for the admin's inspection.
            pub fn peek(&self, state: &State, now_us: u64) -> LimitDecision {
                self.check(&mut state.clone(), now_us, Cost::ZERO)
            }

            /// See [`Algorithm::refund`]; a state of another algorithm is left alone.
            pub fn refund(&self, state: &mut State, at_us: u64, cost: Cost) {
                match (self, state) {
                    $((Policy::$variant(a), State::$variant(s)) => a.refund(s, at_us, cost.get()),)+
                    #[allow(unreachable_patterns)]
                    _ => {}
                }
            }

            /// See [`Algorithm::charge`]; a state of another algorithm starts afresh first.
            pub fn charge(&self, state: &mut State, now_us: u64, cost: Cost) {
                match (self, &mut *state) {
                    $((Policy::$variant(a), State::$variant(s)) => return a.charge(s, now_us, cost.get()),)+
                    #[allow(unreachable_patterns)]
                    _ => {}
                }
                *state = self.fresh_state();
                self.charge(state, now_us, cost)
            }

            /// See [`Algorithm::renew`]; a state of another algorithm is left alone.
            pub fn renew(&self, state: &mut State, at_us: u64, now_us: u64) {
                match (self, state) {
                    $((Policy::$variant(a), State::$variant(s)) => a.renew(s, at_us, now_us),)+
                    #[allow(unreachable_patterns)]
                    _ => {}
                }
            }

            /// See [`Algorithm::idle_at`]; a state of another algorithm is idle already.
            pub fn idle_at(&self, state: &State) -> u64 {
                match (self, state) {
                    $((Policy::$variant(a), State::$variant(s)) => a.idle_at(s),)+
                    #[allow(unreachable_patterns)]
                    _ => 0,
                }
            }

            /// See [`Algorithm::is_idle`].
            pub fn is_idle(&self, state: &State, now_us: u64) -> bool {
                self.idle_at(state) <= now_us
            }
        }

        impl fmt::Display for Policy {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self { $(Policy::$variant(a) => write!(f, "{}: {a}", <$algorithm as Algorithm>::NAME)),+ }
            }
        }
    };
}

/// A rule's limits: one policy or several, every one enforced (written joined by `+`:
/// `token_bucket:20:10+fixed_window:10000:86400`, a burst limit and a daily quota). A request
/// goes through only when each allows it, and a refused one spends nothing in any. From one
/// to [`MAX_LIMITS`](crate::algorithms::MAX_LIMITS), no policy twice.
#[derive(Clone, PartialEq)]
pub struct Limits {
    policies: Box<[Policy]>,
    /// Each policy's [`Policy::fingerprint`], in order: part of every Redis key a decision
    /// names, worked out once here rather than by formatting the policy on each request.
    fingerprints: Box<[u32]>,
}

/// Why a list of policies is not a rule's limits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitsError {
    /// An empty list.
    #[error("no limit: a rule has one at least")]
    Empty,
    /// More than a rule holds.
    #[error("{0} limits, more than the {max} one rule holds", max = crate::algorithms::MAX_LIMITS)]
    TooMany(usize),
    /// The same policy twice: it would be counted twice for one budget.
    #[error("the limit ({0}) is written twice")]
    Repeated(String),
}

impl Limits {
    /// The limits of a rule of one policy.
    pub fn one(policy: Policy) -> Limits {
        Limits::of(Box::new([policy]))
    }

    fn of(policies: Box<[Policy]>) -> Limits {
        let fingerprints = policies.iter().map(Policy::fingerprint).collect();
        Limits {
            policies,
            fingerprints,
        }
    }

    /// The [`Policy::fingerprint`] of the `index`-th limit (0 for none).
    pub fn fingerprint(&self, index: usize) -> u32 {
        self.fingerprints.get(index).copied().unwrap_or(0)
    }

    /// The limits `policies`, in order: what the draft headers list and the stores decide.
    pub fn new(policies: Vec<Policy>) -> Result<Limits, LimitsError> {
        match policies.len() {
            0 => return Err(LimitsError::Empty),
            n if n > crate::algorithms::MAX_LIMITS => return Err(LimitsError::TooMany(n)),
            _ => {}
        }
        for (i, policy) in policies.iter().enumerate() {
            if policies[..i].contains(policy) {
                return Err(LimitsError::Repeated(policy.to_string()));
            }
        }
        Ok(Limits::of(policies.into_boxed_slice()))
    }

    /// The first limit, as written.
    pub fn first(&self) -> &Policy {
        // Never empty: `new` refuses an empty list.
        &self.policies[0]
    }

    /// The smallest limit: the most one request can ever cost and still go through.
    pub fn capacity(&self) -> u64 {
        self.policies.iter().map(Policy::limit).min().unwrap_or(0)
    }
}

impl From<Policy> for Limits {
    fn from(policy: Policy) -> Limits {
        Limits::one(policy)
    }
}

impl std::ops::Deref for Limits {
    type Target = [Policy];

    fn deref(&self) -> &[Policy] {
        &self.policies
    }
}

/// As the policies alone were written (`Limits([...])`): the rule table's digest is made of it,
/// and stays the same across versions that decide alike.
impl fmt::Debug for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Limits").field(&self.policies).finish()
    }
}

impl fmt::Display for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, policy) in self.policies.iter().enumerate() {
            if i > 0 {
                f.write_str(" + ")?;
            }
            write!(f, "{policy}")?;
        }
        Ok(())
    }
}

/// FNV-1a (32 bits) of `text` as written: a digest that is the same in every process and
/// version of Rust, for names of things (a policy, a rule table), never for secrets.
pub(crate) fn fnv1a(text: fmt::Arguments<'_>) -> u32 {
    struct Fnv(u32);
    impl fmt::Write for Fnv {
        fn write_str(&mut self, text: &str) -> fmt::Result {
            for byte in text.bytes() {
                self.0 = (self.0 ^ u32::from(byte)).wrapping_mul(0x0100_0193);
            }
            Ok(())
        }
    }
    let mut digest = Fnv(0x811C_9DC5);
    // Writing to the digest cannot fail.
    let _ = fmt::Write::write_fmt(&mut digest, text);
    digest.0
}

// The registry: one line per algorithm, `Variant(module::Type)`; the module is
// `algorithm/<module>.rs`, its script `scripts/<module>.lua`.
algorithms! {
    TokenBucket(token_bucket::TokenBucket),
    SlidingWindow(sliding_window::SlidingWindow),
    FixedWindow(fixed_window::FixedWindow),
    SlidingLog(sliding_log::SlidingLog),
    Concurrent(concurrent::Concurrent),
}

impl Policy {
    /// Whether this limit counts requests in flight ([`Concurrent`]): what the gate holds a
    /// place of until the response ends, and gives back then.
    pub fn is_concurrent(&self) -> bool {
        matches!(self, Policy::Concurrent(_))
    }
}

/// Every algorithm name `ALGORITHM` (and an Envoy limit's `algorithm`) may be written with,
/// for messages: "token_bucket, gcra, ... or sliding_log", from the algorithms themselves.
pub(crate) fn algorithm_names() -> String {
    either(&Policy::spellings(true))
}

/// The kinds a limit list writes, for messages: the algorithms, and `concurrent`.
fn limit_kinds() -> String {
    either(&Policy::spellings(false))
}

/// `names` as a choice in words: "a, b or c".
fn either(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// A limit list, one limit or several joined by `+`
/// (`token_bucket:20:10+fixed_window:10000:86400`), as `ROUTES`, `LIMITS` and the rules file
/// write it: every limit is enforced. The error names the limit that is wrong.
pub(crate) fn parse_limits(spec: &str) -> Result<Limits, String> {
    let parts: Vec<&str> = spec.split('+').collect();
    let mut policies = Vec::with_capacity(parts.len());
    for part in &parts {
        let policy = parse_limit(part).map_err(|why| match parts.len() {
            1 => why,
            _ => format!("limit {part:?}: {why}"),
        })?;
        policies.push(policy);
    }
    Limits::new(policies).map_err(|why| why.to_string())
}

/// One limit, `ALGORITHM:A:B` (`token_bucket:5:0.1`, `fixed_window:100:60`) or
/// `concurrent:N[:LEASE]`, as `ROUTES`, `LIMITS` and the rules file write it; the error says
/// what is wrong and what is accepted.
pub(crate) fn parse_limit(spec: &str) -> Result<Policy, String> {
    let (algorithm, first, second) = match spec.split(':').collect::<Vec<_>>()[..] {
        [algorithm, first, second] => (algorithm, first, second),
        // The lease is optional: `concurrent:10` holds leases of the default length.
        [algorithm, first] if algorithm == Concurrent::NAME => (algorithm, first, ""),
        _ => {
            return Err(format!(
                "expected ALGORITHM:A:B, e.g. token_bucket:5:0.1 or fixed_window:100:60, or \
                 concurrent:N, not {spec:?}"
            ));
        }
    };
    policy_of(algorithm, first, second)
}

/// The limit of kind `algorithm` with its two numbers as written (`first`, `second`): the
/// algorithm's own parameter parser, its error in words naming the number that is wrong.
pub(crate) fn policy_of(algorithm: &str, first: &str, second: &str) -> Result<Policy, String> {
    match Policy::parse(algorithm, first, second) {
        None => Err(format!(
            "unknown algorithm {algorithm:?}; expected {}",
            limit_kinds()
        )),
        Some(Err(ParameterError::Invalid { index, expected })) => {
            let meaning = Policy::meanings(algorithm).map_or("", |m| m[index]);
            Err(format!(
                "{meaning} {:?}: expected {expected}",
                [first, second][index]
            ))
        }
        Some(Err(ParameterError::Combination(why))) => Err(why),
        Some(Ok(policy)) => Ok(policy),
    }
}

#[cfg(test)]
mod tests;
