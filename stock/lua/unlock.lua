-- unlock.lua: the release of the article "Using redis to implement a
-- distributed lock service in Java" for the unsafe lock demonstrations:
-- delete the lock only if it still holds our value. (The real lock module,
-- lock/, does much more; these strategies exist to show what goes wrong.)
-- KEYS[1] lock key   ARGV[1] our value
-- Returns 1 when released, 0 when the lock was no longer ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
