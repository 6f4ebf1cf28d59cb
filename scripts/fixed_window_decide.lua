-- The fixed window's lean decision on Redis's clock: the hot path of scripts/fixed_window.lua
-- (which pinned clocks, refunds, charges, peeks and rules with other algorithms still run)
-- with the fewest arguments, numbers and calls. It decides and writes exactly as the full
-- script, on the same keys (a count per window, KEYS[1] .. ':' .. its index, and
-- KEYS[1] .. ':w', the newest window counted); the gateway derives the decision's numbers
-- from the reply (FixedWindow's `check`, src/algorithms/fixed_window.rs), and property tests
-- on a real redis-server hold the two to each other. A rule whose every limit is a window is
-- decided without a script on Redis 7 (src/stores/redis.rs, `count`): this serves the rules of
-- several limits with a token bucket among them, the decisions sent together with theirs, and
-- a Redis that refused `PEXPIRE ... NX`.
--
-- A chunk returning the algorithm's lean parts, which the library's lean functions drive
-- (src/algorithms/mod.rs, LEAN_FUNCTIONS): a decision alone (`<library>_d<i>`) and a batch
-- of them (`<library>_lean`), both after one `TIME` and the deadline's check.
--   parameters        how many numbers the rule gives it, before a decision's cost:
--                     1. the window's length in milliseconds
--                     2. the limit, requests per window
--   read(key, now, w) the state at now: the window now falls in (never before the newest
--                     one counted, `:w`), its count (a count no script wrote read as
--                     nothing), whether `:w` is there, the count as stored (false: none, or
--                     not a whole number: written afresh), and a new count's expiry
--   decide(state, now, cost, w, limit)
--                     (numbers, the cost at most the limit + 1, as the gateway sends it)
--                     the state to store when the request fits the window (counted in it),
--                     else nil; nil (nothing to store when refused); then the reply's numbers
--                     after the Redis time: 2 and the window and count decided from, or 0 for
--                     a client never seen
--   write(key, state) store the count as the full script does: its delta (a new key: the
--                     count, expiring W + 1000 ms on); nothing for a state only looked at
--                     (costs of 0). Not `:w`: as the decisions without a script, the lean
--                     part counts in the window it reads `:w` for without moving it (only the
--                     full script does, for a clock that steps back)
-- Numbers go to redis.call as digits made by string.format's '%d' (an integer's formatting):
-- Redis would write a Lua number with '%.17g', a floating-point formatting several times as
-- costly. (The library's load runs without the string library: looked up on each call.)
-- `whole` is the library's (src/algorithms/mod.rs, LEAN_PRELUDE): a whole number in
-- [0, 2^53) or nil, so the state decided on is the state the gateway is handed; so is
-- `placed`, the window now falls in (never before `:w`).
return {
  parameters = 2,
  read = function(key, now, w)
    local window, sw = placed(key, now, w)
    local stored = whole(redis.call('GET', key .. ':' .. string.format('%d', window)))
    -- A new count's expiry, the full script's: the window and a second.
    return {window, stored or 0, sw ~= nil, stored or false, false, w + 1000}
  end,
  decide = function(state, now, cost, w, limit)
    cost = math.min(cost, limit + 1)
    local window, count = state[1], state[2]
    local next
    if count + cost <= limit then
      next = {window, count + cost, state[3], state[4], state[5] or cost > 0, state[6]}
    end
    if state[3] or count > 0 then
      return next, nil, 2, window, count
    end
    return next, nil, 0
  end,
  write = function(key, state)
    if not state[5] then
      return
    end
    local counter = key .. ':' .. string.format('%d', state[1])
    local stored = state[4]
    if stored then
      redis.call('INCRBY', counter, string.format('%d', state[2] - stored))
    else
      redis.call('SET', counter, string.format('%d', state[2]), 'PX', string.format('%d', state[6]))
    end
  end,
}
