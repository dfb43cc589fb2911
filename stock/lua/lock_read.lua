-- lock_read.lua: the `lock` strategy's first round trip on an event loop:
-- take the segment's lock and read what the check needs, in one atomic
-- step. The lock is the lock module's own (lock/lock.h, THE FORMAT), taken
-- by its functions (lock/lua/format.lua: lock_free, lock_take), which this
-- body follows in one script (lock_script_compose): so a holder on the
-- blocking path (or another instance) and this one exclude each other, and
-- the format is written in the lock module only. Reading under the lock
-- also raises the segment's fence to the token (as read.lua does), so a
-- holder whose lease ran out cannot write over this one's work.
--
-- KEYS[1] lock   KEYS[2] the lock's token counter   KEYS[3] gen   KEYS[4] users
-- KEYS[5] idem record   KEYS[6] the segment's stock   KEYS[7] the segment's fence
-- ARGV[1] owner id (32 hex)   ARGV[2] lease ms   ARGV[3] run_id   ARGV[4] user_id
-- Returns {1, token, gen, bought, idem record or '', units} when taken,
-- {0, pttl} when held by another, {-3} (not taken) when there is no valid
-- stock copy.
if not lock_free(KEYS[1]) then
    return {0, redis.call('PTTL', KEYS[1])}
end
local g = redis.call('GET', KEYS[3])
local gen, run_id
if g then gen, run_id = string.match(g, '^(%d+):(.*)$') end
local v = redis.call('GET', KEYS[6])
if not g or run_id ~= ARGV[3] or not v then
    return {-3}                  -- not taken: no lock to release
end
local token = lock_take(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
if tonumber(redis.call('GET', KEYS[7]) or '0') < token then
    redis.call('SET', KEYS[7], token)
end
return {1, token, tonumber(gen), tonumber(redis.call('HGET', KEYS[4], ARGV[4]) or '0'),
        redis.call('GET', KEYS[5]) or '', tonumber(v)}
