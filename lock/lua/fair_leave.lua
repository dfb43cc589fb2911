-- fair_leave.lua: a waiter of a fair lock gives up (its wait ran out, or
-- an error): its place goes, and if it was the head of a free lock, the
-- next one is woken in its stead.
-- KEYS[1] lock, KEYS[2] queue, KEYS[3] due, KEYS[4] sub
-- ARGV[1] waiter id, ARGV[2] wake channel prefix
-- Returns 1.
local was_head = lock_fair_head(KEYS[2]) == ARGV[1]
lock_fair_drop(KEYS[2], KEYS[3], KEYS[4], ARGV[1])
if was_head and lock_free(KEYS[1]) then lock_fair_wake(KEYS[2], KEYS[3], KEYS[4], ARGV[2]) end
return 1
