-- release.lua: compare-and-delete, then wake the next live waiters
-- (format.lua's lock_release, which says how).
-- KEYS[1] lock, KEYS[2] waiter queue
-- ARGV[1] id, ARGV[2] wake channel prefix, ARGV[3] live waiters to wake
-- Returns 1 released, 0 not ours (expired, or someone else's lock).
return lock_release(KEYS[1], KEYS[2], ARGV[1], ARGV[2], tonumber(ARGV[3]))
