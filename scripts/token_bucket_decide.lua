-- The token bucket's lean decision on Redis's clock: the hot path of scripts/token_bucket.lua
-- (which pinned clocks, refunds, charges, peeks and rules with other algorithms still run)
-- with the fewest arguments, numbers and calls. It decides and writes exactly as the full
-- script, on the same key; the gateway derives the decision's numbers from the reply
-- (TokenBucket::decide, src/algorithms/token_bucket.rs), and property tests on a real
-- redis-server hold the two to each other.
--
-- A chunk returning the algorithm's lean parts, which the library's lean functions drive
-- (src/algorithms/mod.rs, LEAN_FUNCTIONS): a decision alone (`<library>_d<i>`) and a batch
-- of them (`<library>_lean`), both after one `TIME` and the deadline's check.
--   parameters        how many numbers the rule gives it, before a decision's cost:
--                     1. tau, the capacity x the interval (µs)
--                     2. the interval (µs)
--   read(key)         the state stored: the TAT in µs, as the full script keeps it (nil: none,
--                     or not a number)
--   decide(tat, now, cost, tau, interval)
--                     (numbers, the cost at most the capacity + 1, as the gateway sends it)
--                     the TAT to store when allowed (the TAT moved on by the cost's
--                     increment, when that leaves it within tau of now), else nil; the TAT to
--                     store even when refused (one past the debt bound, tidied to it so it
--                     ages), else nil; then the reply's numbers after the Redis time: 1 and
--                     the TAT the decision started from (never before now nor past the debt
--                     bound)
--   write(key, tat)   store it
-- Numbers go to redis.call as digits made by string.format's '%d' (an integer's formatting):
-- Redis would write a Lua number with '%.17g', a floating-point formatting several times as
-- costly. (The library's load runs without the string library: looked up on each call.)
return {
  parameters = 2,
  read = function(key)
    -- `whole` is the library's (LEAN_PRELUDE): nothing but a whole number is a TAT.
    return whole(redis.call('GET', key))
  end,
  decide = function(tat, now, cost, tau, interval)
    -- Bounded as the full script bounds a cost: no more than a capacity + 1's worth matters.
    local increment = math.min(cost * interval, 2 * tau)
    local tidied
    if not (tat and tat >= now) then
      -- A client never seen, a full bucket, or not a number (NaN compares false).
      tat = now
    elseif tat > now + 2 * tau then
      -- Past the debt bound: tidied to it (and so it ages), as the full script does.
      tat = now + 2 * tau
      tidied = tat
    end
    local new_tat = tat + increment
    if new_tat - now <= tau then
      return new_tat, tidied, 1, tat
    end
    return nil, tidied, 1, tat
  end,
  -- Expiry is absolute, on the clock the call read (Redis 7.0 still rewrites it for
  -- propagation, but converts no relative time): the first millisecond past the TAT, when the
  -- bucket is full again.
  write = function(key, tat)
    redis.call('SET', key, string.format('%d', tat), 'PXAT', string.format('%d', math.floor(tat / 1000) + 1))
  end,
}
