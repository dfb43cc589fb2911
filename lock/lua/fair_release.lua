-- fair_release.lua: the fair lock's compare-and-delete, then the head of
-- its queue woken (format.lua's lock_fair_release).
-- KEYS[1] lock, KEYS[2] queue, KEYS[3] due, KEYS[4] sub
-- ARGV[1] id, ARGV[2] wake channel prefix
-- Returns 1 released, 0 not ours (expired, or someone else's lock).
if redis.replicate_commands then redis.replicate_commands() end
return lock_fair_release(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2])
