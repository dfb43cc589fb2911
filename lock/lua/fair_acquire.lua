-- fair_acquire.lua: one try at a fair lock (lock.h, FAIRNESS; format.lua,
-- the fair queue). Lapsed places are dropped first; then the lock is taken
-- only if it is free and no one waits before the caller. Otherwise a
-- waiting caller keeps (or takes) its place in the queue, in the same
-- atomic step, so a release after this script wakes it when its turn
-- comes.
-- KEYS[1] lock, KEYS[2] fence counter, KEYS[3] queue, KEYS[4] incarnation,
-- KEYS[5] due, KEYS[6] sub
-- ARGV[1] id (32 hex), ARGV[2] ttl ms, ARGV[3] waiter id ('' = a try that
-- does not queue), ARGV[4] '1' when the waiter listens on its wake channel
-- ('2': listens, on a cluster, where a PUBLISH cannot count it),
-- ARGV[5] the waiter's lease ms, ARGV[6] the queue keys' ttl ms,
-- ARGV[7] the incarnation to store if this server has none (16 random
-- hex), ARGV[8] the wake channel prefix
-- Returns {1, fence, incarnation} when taken; else {0, pttl of the holder
-- (-2: free), rank (-1: not queued), ms to wait before trying again (0: no
-- hint), 1 if the waiter took a new place, its ticket (0: not queued)}.
if redis.replicate_commands then redis.replicate_commands() end
local lock, queue, due, sub = KEYS[1], KEYS[3], KEYS[5], KEYS[6]
local me = ARGV[3]
local now = lock_now_ms()
local pruned = lock_fair_prune(queue, due, sub, now)
local head = lock_fair_head(queue)
local free = lock_free(lock)
if free and (not head or head == me) then
    local fence = lock_take(lock, KEYS[2], ARGV[1], ARGV[2])
    local inc = lock_incarnation(KEYS[4], ARGV[7])
    if head then lock_fair_drop(queue, due, sub, me) end   -- it was the head
    return {1, fence, inc}
end
-- Dropping lapsed places made a new head of a free lock: nobody woke it.
if free and pruned > 0 and head ~= me then lock_fair_wake(queue, due, sub, ARGV[8]) end
local pttl = redis.call('pttl', lock)
if me == '' then return {0, pttl, -1, 0, 0, 0} end
local joined, rank = lock_fair_stay(queue, due, sub, me, ARGV[4], tonumber(ARGV[5]),
                                    now, tonumber(ARGV[6]))
local hint = 0
if rank == 0 and pttl > 0 then
    hint = pttl + 1                      -- the holder's lease: an expiry has no notice
elseif rank == 1 and free then
    -- The head was woken and has until its due to come; if it does not,
    -- this waiter, next in line, looks again then.
    local hd = redis.call('zscore', due, lock_fair_head(queue))
    if hd then hint = math.max(tonumber(hd) - now + 1, 1) end
end
return {0, pttl, rank, hint, joined, tonumber(redis.call('zscore', queue, me)) or 0}
