-- format.lua: the lock's Redis format (lock/lock.h, THE FORMAT), written
-- once, as Lua local functions. Every script that touches a lock is this
-- file followed by its own body (lock_script_compose): the lock module's
-- acquire, release, extend and settle, and scripts of other modules that
-- take or free a lock inside their own atomic step (the stock module's
-- lock_read and lock_write), so they all agree on what a lock is.
-- It only defines functions: nothing runs until the body calls them, so a
-- body may still begin with redis.replicate_commands().
--
-- lock is the lock's key (NAME), fence its token counter (B:fence), queue
-- its waiter queue (B:waiters), wake its wake channel prefix (B:wake:); the
-- caller passes them in KEYS, as Redis Cluster wants.

-- The value of a lock held by owner id with fencing token token.
local function lock_value(id, token)
    return id .. ':' .. token
end

-- Whether no one holds the lock.
local function lock_free(lock)
    return redis.call('exists', lock) == 0
end

-- Takes a free lock for owner id, with a lease of ttl ms: the next token
-- from the counter (which never expires, so tokens never go back), then
-- SET "<id>:<token>" PX. Returns the token.
local function lock_take(lock, fence, id, ttl)
    local token = redis.call('incr', fence)
    redis.call('set', lock, lock_value(id, token), 'px', ttl)
    return token
end

-- Whether the lock is held by owner id: its value starts with "<id>:".
local function lock_ours(lock, id)
    local v = redis.call('get', lock)
    if not v then return false end
    return string.sub(v, 1, #id + 1) == id .. ':'
end

-- Compare-and-delete: frees the lock if owner id holds it, then wakes up to
-- want live waiters. The marker published first on the bare prefix tells
-- clients that watch the key's keyspace notifications that this DEL is one
-- of ours, whose queue wakes a waiter below; they ignore its del event.
-- Waiters whose PUBLISH reaches nobody have gone; they are dropped, but at
-- most 64 per release, so a queue of dead entries cannot stall Redis.
-- Returns 1 freed, 0 not ours (expired, or someone else's lock).
local function lock_release(lock, queue, id, wake, want)
    if not lock_ours(lock, id) then
        return 0
    end
    redis.call('publish', wake, 'released')
    redis.call('del', lock)
    local woke = 0
    for _ = 1, 64 do
        if woke >= want then break end
        local head = redis.call('zpopmin', queue)
        if #head == 0 then break end
        if redis.call('publish', wake .. head[1], 'released') > 0 then
            woke = woke + 1
        end
    end
    return 1
end
