-- settle.lua: Redlock only. Makes one fencing token of the quorum's: raises
-- this server's counter to the agreed token (the highest the quorum gave),
-- stores the agreed incarnation (the one every server of the quorum gave,
-- or a new one when they differed: lock.c, settle) and rewrites the lock
-- value with the token, keeping the TTL. Any later majority shares a server
-- with this one, so its token will be higher. Runs after format.lua
-- (lock_ours, lock_value).
-- KEYS[1] lock, KEYS[2] fence counter, KEYS[3] incarnation
-- ARGV[1] id, ARGV[2] agreed token, ARGV[3] agreed incarnation
-- Returns 1 done, 0 the lock is no longer ours here.
if not lock_ours(KEYS[1], ARGV[1]) then
    return 0
end
if (tonumber(redis.call('get', KEYS[2])) or 0) < tonumber(ARGV[2]) then
    redis.call('set', KEYS[2], ARGV[2])
end
redis.call('set', KEYS[3], ARGV[3])
local pt = redis.call('pttl', KEYS[1])
if pt > 0 then
    redis.call('set', KEYS[1], lock_value(ARGV[1], ARGV[2]), 'px', pt)
end
return 1
