-- The sliding window's lean decision on Redis's clock: the hot path of
-- scripts/sliding_window.lua (which pinned clocks, refunds, charges, peeks and rules with
-- other algorithms still run) with the fewest arguments, numbers and calls. It decides and
-- writes exactly as the full script, on the same hash; the gateway derives the decision's
-- numbers from the reply (SlidingWindow::decide, src/algorithms/sliding_window.rs), and
-- property tests on a real redis-server hold the two to each other.
--
-- A chunk returning the algorithm's lean parts, which the library's lean functions drive
-- (src/algorithms/mod.rs, LEAN_FUNCTIONS): a decision alone (`<library>_d<i>`) and a batch
-- of them (`<library>_lean`), both after one `TIME` and the deadline's check.
--   parameters        how many numbers the rule gives it, before a decision's cost:
--                     1. the window's length in milliseconds
--                     2. the limit, requests per window
--   read(key)         the hash's w (window index), p and c (counts) as numbers, or nil for
--                     no hash
--   decide(state, now, cost, w, limit)
--                     (numbers, the cost at most the limit + 1, as the gateway sends it)
--                     the state to store when the request fits the sliding window (counted in
--                     it), else nil; nil (nothing to store when refused); then the reply's
--                     numbers after the Redis time: 3 and the state as read, w, p and c
--                     (counts only read together), or 0 for none
--   write(key, state) store it, expiring two windows after its window's start
-- Numbers go to redis.call as digits made by string.format's '%d' (an integer's formatting):
-- Redis would write a Lua number with '%.17g', a floating-point formatting several times as
-- costly. (The library's load runs without the string library: looked up on each call.)
return {
  parameters = 2,
  read = function(key)
    local stored = redis.call('HMGET', key, 'w', 'p', 'c')
    local w = tonumber(stored[1])
    if w then
      return {w, tonumber(stored[2]), tonumber(stored[3])}
    end
  end,
  decide = function(state, now, cost, w, limit)
    cost = math.min(cost, limit + 1)
    local sw, sp, sc
    if state then
      sw, sp, sc = state[1], state[2], state[3]
    end
    if not (sp and sc) then
      sp, sc = 0, 0
    end
    local now_ms = math.floor(now / 1000)
    if sw and sw * w > now_ms then
      now_ms = sw * w
    end
    local window = math.floor(now_ms / w)
    local start = window * w
    local previous, current = 0, 0
    if sw == window then
      previous, current = sp, sc
    elseif sw and sw + 1 == window then
      previous = sc
    end
    local next
    if cost <= limit and previous * (w - now_ms + start) + (current + cost) * w <= limit * w then
      next = {window, previous, current + cost, w}
    end
    if sw then
      return next, nil, 3, sw, sp, sc
    end
    return next, nil, 0
  end,
  -- Absolute, on the clock the call read (no rewrite for propagation, as EXPIRE has): nothing
  -- it counts weighs two windows on.
  write = function(key, state)
    local window, w = state[1], state[4]
    redis.call('HSET', key, 'w', string.format('%d', window), 'p', string.format('%d', state[2]), 'c', string.format('%d', state[3]))
    redis.call('PEXPIREAT', key, string.format('%d', window * w + 2 * w))
  end,
}
