-- extend.lua: renew the lease if the lock is still ours. Runs after
-- format.lua (lock_ours).
-- KEYS[1] lock; ARGV[1] id, ARGV[2] ttl ms
-- Returns 1 renewed, 0 not ours (gone or taken by another).
if lock_ours(KEYS[1], ARGV[1]) then
    redis.call('pexpire', KEYS[1], ARGV[2])
    return 1
end
return 0
