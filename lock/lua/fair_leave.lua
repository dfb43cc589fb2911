-- fair_leave.lua: a waiter of a fair lock gives up (its wait ran out, or
-- an error): format.lua's lock_fair_leave.
-- KEYS[1] lock, KEYS[2] queue, KEYS[3] due, KEYS[4] sub
-- ARGV[1] waiter id, ARGV[2] wake channel prefix
-- Returns 1.
lock_fair_leave(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2])
return 1
