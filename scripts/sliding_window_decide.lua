-- The sliding window's lean decision on Redis's clock: the hot path of
-- scripts/sliding_window.lua (which pinned clocks, refunds, charges, peeks and rules with
-- other algorithms still run) with the fewest arguments, numbers and calls. It decides and
-- writes exactly as the full script, on the same keys (a count per window, KEYS[1] .. ':' ..
-- its index, and KEYS[1] .. ':w', the newest window counted); the gateway derives the
-- decision's numbers from the reply (SlidingWindow::decide, src/algorithms/sliding_window.rs),
-- and property tests on a real redis-server hold the two to each other. A rule of one sliding
-- window on Redis 7 is decided without a script (src/stores/redis.rs, `count`): this serves
-- the batches, the rules of several limits and the decisions sent together.
--
-- A chunk returning the algorithm's lean parts, which the library's lean functions drive
-- (src/algorithms/mod.rs, LEAN_FUNCTIONS): a decision alone (`<library>_d<i>`) and a batch
-- of them (`<library>_lean`), both after one `TIME` and the deadline's check.
--   parameters        how many numbers the rule gives it, before a decision's cost:
--                     1. the window's length in milliseconds
--                     2. the limit, requests per window
--   read(key, now, w) the state at now: the window now falls in (never before the newest
--                     one counted, `:w`), the previous and current counts (a count no
--                     script wrote read as nothing), the newest window counted (false:
--                     none) and the current count as stored (false: none)
--   decide(state, now, cost, w, limit)
--                     (numbers, the cost at most the limit + 1, as the gateway sends it)
--                     the state to store when the request fits the sliding window (counted in
--                     it), else nil; nil (nothing to store when refused); then the reply's
--                     numbers after the Redis time: 3 and the window, previous and current
--                     counts decided from, or 0 for a client never seen
--   write(key, state) store the count as the full script does: its delta (a new key: the
--                     count, expiring 2W + 1000 ms on, more for a window ahead of the clock);
--                     nothing for a state only looked at (costs of 0). Not `:w`: as the
--                     decisions without a script, the lean part counts in the window it
--                     reads `:w` for without moving it (only the full script does, for a
--                     clock that steps back; a new key's SET saved on every client's first
--                     count of a window)
-- Numbers go to redis.call as digits made by string.format's '%d' (an integer's formatting):
-- Redis would write a Lua number with '%.17g', a floating-point formatting several times as
-- costly. (The library's load runs without the string library: looked up on each call.)
-- `whole` is the library's (src/algorithms/mod.rs, LEAN_PRELUDE): a whole number in
-- [0, 2^53) or nil, so the state decided on is the state the gateway is handed; so is
-- `placed`, the window now falls in (never before `:w`).
local function count_of(value)
  return whole(value) or 0
end
return {
  parameters = 2,
  read = function(key, now, w)
    local window, sw, now_ms = placed(key, now, w)
    -- Not a whole number: written afresh (SET), never added to.
    local stored = whole(redis.call('GET', key .. ':' .. string.format('%d', window)))
    local previous = count_of(redis.call('GET', key .. ':' .. string.format('%d', window - 1)))
    -- A new count's expiry: two windows and a second, and as far as the window is ahead of
    -- the clock (one a clock that stepped back counts in).
    local ttl = 2 * w + 1000 + now_ms - math.floor(now / 1000)
    return {window, previous, count_of(stored), sw or false, stored or false, false, ttl}
  end,
  decide = function(state, now, cost, w, limit)
    cost = math.min(cost, limit + 1)
    local window, previous, current = state[1], state[2], state[3]
    local start = window * w
    local now_ms = math.max(math.floor(now / 1000), start)
    local next
    if cost <= limit and previous * (w - now_ms + start) + (current + cost) * w <= limit * w then
      next = {window, previous, current + cost, state[4], state[5], state[6] or cost > 0, state[7]}
    end
    if state[4] or previous > 0 or current > 0 then
      return next, nil, 3, window, previous, current
    end
    return next, nil, 0
  end,
  write = function(key, state)
    if not state[6] then
      return
    end
    local window, stored, ttl = state[1], state[5], string.format('%d', state[7])
    local counter = key .. ':' .. string.format('%d', window)
    if stored then
      redis.call('INCRBY', counter, string.format('%d', state[3] - stored))
    else
      redis.call('SET', counter, string.format('%d', state[3]), 'PX', ttl)
    end
  end,
}
