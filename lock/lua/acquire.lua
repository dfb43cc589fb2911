-- acquire.lua: take the lock if it is free; if not and the caller waits,
-- join the waiter queue in the same atomic step, so a release that runs
-- after this script is guaranteed to see (and wake) the caller. Runs after
-- format.lua (lock_free, lock_take, lock_incarnation).
-- KEYS[1] lock, KEYS[2] fence counter, KEYS[3] waiter queue, KEYS[4] incarnation
-- ARGV[1] id (32 hex), ARGV[2] ttl ms, ARGV[3] waiter id ('' = not waiting),
-- ARGV[4] queue score ('' = new arrival: server time), ARGV[5] queue ttl ms,
-- ARGV[6] the incarnation to store if this server has none (16 random hex)
-- Returns {1, fence, incarnation} when taken, {0, pttl of the holder, queue
-- score} when held.
if redis.replicate_commands then redis.replicate_commands() end
if lock_free(KEYS[1]) then
    local fence = lock_take(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
    local inc = lock_incarnation(KEYS[4], ARGV[6])
    if ARGV[3] ~= '' then redis.call('zrem', KEYS[3], ARGV[3]) end
    return {1, fence, inc}
end
local score = 0
if ARGV[3] ~= '' then
    local cur = redis.call('zscore', KEYS[3], ARGV[3])
    if cur then
        score = tonumber(cur)
    else
        -- A waiter woken (popped) but beaten to the lock keeps its place.
        score = tonumber(ARGV[4])
        if not score then
            local t = redis.call('time')
            score = tonumber(t[1]) * 1000000 + tonumber(t[2])
        end
        redis.call('zadd', KEYS[3], score, ARGV[3])
    end
    if redis.call('pttl', KEYS[3]) < tonumber(ARGV[5]) then
        redis.call('pexpire', KEYS[3], ARGV[5])
    end
end
return {0, redis.call('pttl', KEYS[1]), score}
