"""Redis work-queue backend: workers on many hosts.

Every operation is one Lua script (atomic on the server; time from the server's clock, so
hosts with skewed clocks agree on lease deadlines). Everything stored is JSON or plain
numbers and strings: nothing read from Redis is ever unpickled. The URL's password is
registered as a secret, so it never appears in a log line or an error message.

Keys of queue ``N`` (the hash tag keeps them in one cluster slot):
``shardfeed:wq:{N}:meta`` (JSON), ``:state`` (hash: next_epoch, num_epochs, token,
restore_id, counters, the server's ``run_id`` last seen and ``restarts``, ``req:<w>``: each
worker's last request id and its answer), ``:pending`` (list), ``:lease`` (hash id -> JSON), ``:dead``
(sorted set id -> deadline), ``:epochs`` (hash epoch -> done), ``:workers`` (hash
``taken:<w>``, ``acked:<w>``, ``first:<w>``, ``last:<w>``), ``:back`` (set: ids given back,
expired or released, not taken again yet); ``shardfeed:wq:names`` (set).
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..errors import ShardfeedError, WorkQueueLostError
from ..registry import require
from ..storage.urls import mask, register_secret
from .backend import COUNTERS, QueueBackend, gone

logger = logging.getLogger(__name__)

NAMES_KEY = "shardfeed:wq:names"
_SUFFIXES = ("meta", "state", "pending", "lease", "dead", "epochs", "workers", "back")

_NOW = "local t = redis.call('TIME'); local now = tonumber(t[1]) + tonumber(t[2]) / 1000000\n"

_OPEN = """
local m = redis.call('GET', KEYS[1])
if m then return m end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8])
redis.call('HSET', KEYS[2], 'next_epoch', 0, 'num_epochs', ARGV[2], 'token', 0, 'restore_id', '',
           'taken', 0, 'acked', 0, 'expired', 0, 'late_acks', 0, 'released', 0, 'redelivered', 0, 'gen', ARGV[4])
redis.call('SADD', KEYS[9], ARGV[3])
return false
"""

_GEN_CHECK = """
local g = redis.call('HGET', KEYS[1], 'gen')
if g and GEN ~= '' and g ~= GEN then return cjson.encode({status='recreated'}) end
"""

# A lease measures how long its worker has been silent; while the server was down no
# worker could speak. So the first take after a restart (a new run_id: the data came back
# from the AOF) gives every lease its full term again from now, before any is reclaimed.
_GRACE = """
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
local seen = redis.call('HGET', KEYS[1], 'run_id')
if run and seen ~= run then
  if seen then
    local all = redis.call('HGETALL', KEYS[3])
    for i = 1, #all, 2 do
      local l = cjson.decode(all[i + 1])
      local d = now + (tonumber(l.lease_s) or lease_s)
      if d > l.deadline then
        l.deadline = d
        redis.call('HSET', KEYS[3], all[i], cjson.encode(l)); redis.call('ZADD', KEYS[4], d, all[i])
      end
    end
    redis.call('HINCRBY', KEYS[1], 'restarts', 1)
  end
  redis.call('HSET', KEYS[1], 'run_id', run)
end
"""

_TAKE_BODY = """
if redis.call('EXISTS', KEYS[1]) == 0 then return cjson.encode({status='missing'}) end
""" + _GEN_CHECK + """
local worker, lease_s = ARGV[1], tonumber(ARGV[2])
""" + _GRACE + """
local exp = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
for i = #exp, 1, -1 do
  redis.call('HDEL', KEYS[3], exp[i]); redis.call('ZREM', KEYS[4], exp[i]); redis.call('LPUSH', KEYS[2], exp[i])
  redis.call('SADD', BACK, exp[i])
end
if #exp > 0 then redis.call('HINCRBY', KEYS[1], 'expired', #exp) end
local id = redis.call('LPOP', KEYS[2])
if id then
  if redis.call('SREM', BACK, id) == 1 then redis.call('HINCRBY', KEYS[1], 'redelivered', 1) end
  local token = redis.call('HINCRBY', KEYS[1], 'token', 1)
  local deadline = now + lease_s
  redis.call('HSET', KEYS[3], id, cjson.encode({worker=worker, token=token, deadline=deadline, lease_s=lease_s}))
  redis.call('ZADD', KEYS[4], deadline, id)
  redis.call('HINCRBY', KEYS[1], 'taken', 1)
  redis.call('HINCRBY', KEYS[5], 'taken:' .. worker, 1)
  redis.call('HSETNX', KEYS[5], 'first:' .. worker, tostring(now))
  redis.call('HSETNX', KEYS[5], 'last:' .. worker, tostring(now))
  return cjson.encode({status='item', id=id, token=token, deadline=deadline})
end
local ne = tonumber(redis.call('HGET', KEYS[1], 'next_epoch'))
local num = redis.call('HGET', KEYS[1], 'num_epochs')
if num == '' or ne < tonumber(num) then return cjson.encode({status='need_epoch', epoch=ne}) end
local soon = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
if #soon > 0 then return cjson.encode({status='wait', retry_s=math.max(0, tonumber(soon[2]) - now)}) end
return cjson.encode({status='drained'})
"""
# A call retried because its reply was lost with the connection (the server restarting
# after it ran the script) gets the answer the first run gave, instead of acknowledging
# again (refused as late) or taking a second item (leased to a worker that never hears of
# it). Each call carries a request id; the last one of each worker is kept with its answer.
_ONCE = """
local function replayed(state, worker, req)
  if req == '' then return nil end
  local last = redis.call('HGET', state, 'req:' .. worker)
  if last and string.sub(last, 1, #req + 1) == req .. ' ' then return string.sub(last, #req + 2) end
  return nil
end
local function remember(state, worker, req, out)
  if req ~= '' and redis.call('EXISTS', state) == 1 then
    redis.call('HSET', state, 'req:' .. worker, req .. ' ' .. out)
  end
  return out
end
"""

# KEYS: state, pending, lease, dead, workers, back. ARGV: worker, lease_s, generation, request id.
_TAKE = _NOW + _ONCE + """
local GEN = ARGV[3]
local BACK = KEYS[6]
local r = replayed(KEYS[1], ARGV[1], ARGV[4])
if r then return r end
local function take()
""" + _TAKE_BODY + """
end
return remember(KEYS[1], ARGV[1], ARGV[4], take())
"""


_FILL = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if tonumber(redis.call('HGET', KEYS[1], 'next_epoch')) ~= tonumber(ARGV[1]) then return 0 end
for i = 2, #ARGV, 1000 do
  redis.call('RPUSH', KEYS[2], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
redis.call('HSET', KEYS[1], 'next_epoch', tonumber(ARGV[1]) + 1)
return 1
"""

# ack(): the acknowledgement both scripts below make; 1 done, 0 refused (late_acks counted).
_ACK_FN = """
local function ack(state, lease, dead, epochs, workers, id, token, worker, epoch)
  local v = redis.call('HGET', lease, id)
  if (not v) or cjson.decode(v).token ~= tonumber(token) then
    redis.call('HINCRBY', state, 'late_acks', 1)
    return 0
  end
  redis.call('HDEL', lease, id); redis.call('ZREM', dead, id)
  redis.call('HINCRBY', state, 'acked', 1)
  redis.call('HINCRBY', epochs, epoch, 1)
  redis.call('HINCRBY', workers, 'acked:' .. worker, 1)
  redis.call('HSETNX', workers, 'first:' .. worker, tostring(now))
  redis.call('HSET', workers, 'last:' .. worker, tostring(now))
  return 1
end
"""
# KEYS: state, lease, dead, epochs, workers. ARGV: item id, token, worker, epoch, request id.
_ACK = _NOW + _ACK_FN + _ONCE + """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local r = replayed(KEYS[1], ARGV[3], ARGV[5])
if r then return tonumber(r) end
local got = ack(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
return tonumber(remember(KEYS[1], ARGV[3], ARGV[5], tostring(got)))
"""

# Acknowledge an item and take the next in one round trip. KEYS: state, pending, lease,
# dead, workers (the take script's layout), epochs, back. ARGV: worker, lease_s, item id,
# token, epoch, generation, request id.
_ACK_TAKE = _NOW + _ACK_FN + _ONCE + """
local GEN = ARGV[6]
local BACK = KEYS[7]
if redis.call('EXISTS', KEYS[1]) == 0 then return cjson.encode({status='missing'}) end
""" + _GEN_CHECK + """
local r = replayed(KEYS[1], ARGV[1], ARGV[7])
if r then return r end
local acked = ack(KEYS[1], KEYS[3], KEYS[4], KEYS[6], KEYS[5], ARGV[3], ARGV[4], ARGV[1], ARGV[5])
local function take()
""" + _TAKE_BODY + """
end
local out = cjson.decode(take())
out['acked'] = acked
return remember(KEYS[1], ARGV[1], ARGV[7], cjson.encode(out))
"""


_RENEW = _NOW + """
local v = redis.call('HGET', KEYS[1], ARGV[1])
if (not v) then return 0 end
local lease = cjson.decode(v)
if lease.token ~= tonumber(ARGV[2]) then return 0 end
lease.deadline = now + tonumber(ARGV[3]); lease.lease_s = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(lease)); redis.call('ZADD', KEYS[2], lease.deadline, ARGV[1])
return 1
"""

_RELEASE = """
local v = redis.call('HGET', KEYS[2], ARGV[1])
if (not v) or cjson.decode(v).token ~= tonumber(ARGV[2]) then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1]); redis.call('ZREM', KEYS[3], ARGV[1]); redis.call('LPUSH', KEYS[4], ARGV[1])
redis.call('SADD', KEYS[5], ARGV[1])
redis.call('HINCRBY', KEYS[1], 'released', 1)
return 1
"""

_RESTORE = """
if redis.call('HGET', KEYS[2], 'restore_id') == ARGV[2] then return 0 end
local token = tonumber(redis.call('HGET', KEYS[2], 'token') or '0')
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8])
redis.call('SET', KEYS[1], ARGV[1])
local st = cjson.decode(ARGV[3])
redis.call('HSET', KEYS[2], 'next_epoch', st.next_epoch, 'num_epochs', ARGV[4], 'token', token, 'restore_id', ARGV[2],
           'taken', st.counters.taken or 0, 'acked', st.counters.acked or 0, 'expired', st.counters.expired or 0,
           'late_acks', st.counters.late_acks or 0, 'released', st.counters.released or 0,
           'redelivered', st.counters.redelivered or 0, 'gen', ARGV[6])
for i = 1, #st.pending, 1000 do
  redis.call('RPUSH', KEYS[3], unpack(st.pending, i, math.min(i + 999, #st.pending)))
end
for e, d in pairs(st.epoch_done) do redis.call('HSET', KEYS[6], e, d) end
redis.call('SADD', KEYS[9], ARGV[5])
return 1
"""

_DRAIN = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local n = redis.call('LLEN', KEYS[2])
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'num_epochs', redis.call('HGET', KEYS[1], 'next_epoch'))
return n
"""


RECONNECT_S = 60.0
"""How long a Redis backend keeps retrying a lost connection (``?reconnect_s=`` in the URL)."""


def _take_reconnect(url: str, reconnect_s: float | None) -> tuple[str, float]:
    """``reconnect_s`` from the argument, else from the URL's query (removed from the URL
    given to redis-py), else :data:`RECONNECT_S`."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)]
    found = [v for k, v in query if k == "reconnect_s"]
    if found:
        url = urlunsplit(parts._replace(query=urlencode([(k, v) for k, v in query if k != "reconnect_s"])))
    value = reconnect_s if reconnect_s is not None else (found[-1] if found else RECONNECT_S)
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"reconnect_s must be a number of seconds, got {value!r}") from None
    if value < 0:
        raise ValueError(f"reconnect_s must be >= 0, got {value}")
    return url, value


def _gen(meta: dict) -> str:
    """The generation of a queue: when its meta was made (a queue lost and made again has
    another)."""
    return repr(meta.get("created", ""))


class RedisBackend(QueueBackend):
    """Queues on the Redis server at ``url`` (``redis://[:password@]host:port/db``)."""

    def __init__(self, url: str, reconnect_s: float | None = None, **client_kwargs: Any) -> None:
        redis = require("redis", what="the Redis work-queue backend")
        password = urlsplit(url).password
        if password:
            register_secret(password)
        url, reconnect_s = _take_reconnect(url, reconnect_s)
        self.url = mask(url)
        self.reconnect_s = reconnect_s
        self._errors = redis.exceptions.RedisError
        self._lost = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                      redis.exceptions.BusyLoadingError)
        # a wrong password is final, not a blip (redis-py makes it a ConnectionError)
        self._final = (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError)
        self._answered = False  # retry only a server that answered before: a restart, not a typo
        self._gens: dict[str, str] = {}  # queue name -> the generation this worker joined
        try:
            self._r = redis.Redis.from_url(url, decode_responses=True, **client_kwargs)
        except (ValueError, self._errors) as exc:
            raise ValueError(f"bad Redis URL {self.url}: {mask(exc)}") from None
        self._scripts = {k: self._r.register_script(v) for k, v in (
            ("open", _OPEN), ("take", _TAKE), ("fill", _FILL), ("ack", _ACK), ("renew", _RENEW),
            ("release", _RELEASE), ("restore", _RESTORE), ("drain", _DRAIN), ("ack_take", _ACK_TAKE))}

    def _keys(self, name: str) -> list[str]:
        return [f"shardfeed:wq:{{{name}}}:{s}" for s in _SUFFIXES]

    def _call(self, what: str, fn: Callable[[], Any], stop: Callable[[], bool] | None = None) -> Any:
        """``fn()``; a lost connection to a server that answered before (it restarted, the
        network blinked) is retried with backoff for ``reconnect_s`` seconds before it
        becomes an error. Leases live on the server, so a worker that reconnects in time
        keeps its items. A server never reached, or a refused password, fails at once; so
        does a lost one once ``stop()`` is true."""
        deadline = None
        wait = 0.05
        while True:
            try:
                out = fn()
                self._answered = True
                return out
            except self._final as exc:
                raise ShardfeedError(f"work queue on {self.url}: {what} failed: {mask(exc)}") from None
            except self._lost as exc:
                if not self._answered:  # never reached: a wrong address fails at once
                    raise ShardfeedError(f"work queue on {self.url}: {what} failed: {mask(exc)}") from None
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.reconnect_s
                    logger.warning("work queue on %s: %s lost the connection (%s); retrying for up to %.0f s",
                                   self.url, what, mask(exc), self.reconnect_s)
                if now + wait > deadline:
                    raise ShardfeedError(f"work queue on {self.url}: {what} failed: the server did not answer "
                                         f"for {self.reconnect_s:.0f} s ({mask(exc)})") from None
                if stop is not None and stop():
                    raise ShardfeedError(f"work queue on {self.url}: {what} given up: the server did not answer "
                                         f"and the caller stopped ({mask(exc)})") from None
                time.sleep(wait)
                wait = min(wait * 2, 2.0)
            except self._errors as exc:
                raise ShardfeedError(f"work queue on {self.url}: {what} failed: {mask(exc)}") from None

    def _run(self, script: str, keys: list[str], args: list[Any], stop: Callable[[], bool] | None = None) -> Any:
        return self._call(script, lambda: self._scripts[script](keys=keys, args=args), stop)

    def _check_lost(self, name: str, out: dict) -> None:
        status = out["status"]
        if status == "missing":
            raise self._missing(name)
        if status == "recreated":
            raise WorkQueueLostError(
                f"work queue {name!r} on {self.url} was lost and created again since this worker joined it (a "
                "Redis restart without persistence?): this worker stops rather than run the epoch again. Run "
                "Redis with persistence (appendonly yes), and restore from a checkpoint (WorkQueue.set_state)")

    def _missing(self, name: str) -> KeyError:
        """The error for a queue not found: for a worker that joined it, the queue was lost
        (every call path says so alike, :class:`WorkQueueLostError`); else a plain KeyError."""
        if name in self._gens:
            return WorkQueueLostError(gone(name, self.url))
        return KeyError(f"no work queue named {name!r} on {self.url}")

    def _check_joined(self, name: str) -> None:
        """After a lease call found no lease: raise :class:`WorkQueueLostError` when the
        queue this worker joined is gone or was made again (a lost lease alone is no error)."""
        if name not in self._gens:
            return
        raw = self._call("read", lambda: self._r.get(self._keys(name)[0]))
        if raw is None:
            raise self._missing(name)
        if _gen(json.loads(raw)) != self._gens[name]:
            self._check_lost(name, {"status": "recreated"})

    def open(self, name: str, meta: dict) -> tuple[dict, bool]:
        k = self._keys(name)
        ne = meta.get("num_epochs")
        got = self._run("open", [*k, NAMES_KEY], [json.dumps(meta), "" if ne is None else ne, name, _gen(meta)])
        out = (meta, True) if got is None else (json.loads(got), False)
        self._gens[name] = _gen(out[0])
        return out

    def get_meta(self, name: str) -> dict | None:
        k = self._keys(name)
        raw, rid = self._call("read", lambda: (self._r.get(k[0]), self._r.hget(k[1], "restore_id")))
        if raw is None:
            return None
        meta = dict(json.loads(raw), restore_id=rid or None)
        self._gens.setdefault(name, _gen(meta))  # the queue this worker joined
        return meta

    def take(self, name: str, worker: str, lease_s: float) -> dict:
        k = self._keys(name)
        out = json.loads(self._run("take", [k[1], k[2], k[3], k[4], k[6], k[7]],
                                   [worker, lease_s, self._gens.get(name, ""), secrets.token_hex(8)]))
        self._check_lost(name, out)
        if out["status"] == "item":
            out["token"] = int(out["token"])
        return out

    def fill_epoch(self, name: str, epoch: int, order: list[int]) -> bool:
        k = self._keys(name)
        got = self._run("fill", [k[1], k[2]], [epoch, *(f"{epoch}:{i}" for i in order)])
        if got == -1:
            raise self._missing(name)
        return got == 1

    def ack(self, name: str, item_id: str, token: int, worker: str) -> bool:
        k = self._keys(name)
        got = self._run("ack", [k[1], k[3], k[4], k[5], k[6]],
                        [item_id, token, worker, item_id.split(":")[0], secrets.token_hex(8)])
        if got == -1:
            raise self._missing(name)
        if got != 1:
            self._check_joined(name)  # a refused ack on a queue made again is a lost queue
        return got == 1

    def ack_and_take(self, name: str, item_id: str, token: int, worker: str, lease_s: float) -> tuple[bool, dict]:
        k = self._keys(name)
        out = json.loads(self._run("ack_take", [k[1], k[2], k[3], k[4], k[6], k[5], k[7]],
                                   [worker, lease_s, item_id, token, item_id.split(":")[0], self._gens.get(name, ""),
                                    secrets.token_hex(8)]))
        self._check_lost(name, out)
        if out["status"] == "item":
            out["token"] = int(out["token"])
        return bool(out.pop("acked")), out

    def renew(self, name: str, item_id: str, token: int, lease_s: float) -> bool:
        return self.renew_unless(name, item_id, token, lease_s, lambda: False)

    def renew_unless(self, name: str, item_id: str, token: int, lease_s: float, stop: Callable[[], bool]) -> bool:
        k = self._keys(name)
        if self._run("renew", [k[3], k[4]], [item_id, token, lease_s], stop) == 1:
            return True
        self._check_joined(name)
        return False

    def release(self, name: str, item_id: str, token: int) -> bool:
        k = self._keys(name)
        if self._run("release", [k[1], k[3], k[4], k[2], k[7]], [item_id, token]) == 1:
            return True
        self._check_joined(name)
        return False

    def snapshot(self, name: str) -> dict | None:
        k = self._keys(name)

        def read() -> list:
            p = self._r.pipeline(transaction=True)
            p.hgetall(k[1]).lrange(k[2], 0, -1).hgetall(k[3]).hgetall(k[5]).hgetall(k[6]).time()
            return p.execute()
        state, pending, lease, epochs, wfields, t = self._call("snapshot", read)
        if not state:
            if name in self._gens:
                raise self._missing(name)  # the queue this worker joined was lost
            return None
        workers: dict[str, dict[str, float]] = {}
        for f, v in wfields.items():
            field, w = f.split(":", 1)
            workers.setdefault(w, {"taken": 0, "acked": 0, "first": 0.0, "last": 0.0})[field] = float(v)
        for st in workers.values():
            st["taken"], st["acked"] = int(st["taken"]), int(st["acked"])
        inflight = {}
        for i, v in lease.items():
            d = json.loads(v)
            inflight[i] = {"worker": d["worker"], "token": int(d["token"]), "deadline": float(d["deadline"])}
        ne = state.get("num_epochs", "")
        return {"next_epoch": int(state["next_epoch"]), "num_epochs": None if ne == "" else int(ne),
                "pending": pending, "inflight": inflight,
                "counters": {c: int(state.get(c, 0)) for c in COUNTERS},
                "epoch_done": {e: int(d) for e, d in epochs.items()}, "workers": workers,
                "now": t[0] + t[1] / 1e6}

    def restore(self, name: str, meta: dict, state: dict, restore_id: str) -> bool:
        k = self._keys(name)
        st = {"next_epoch": int(state["next_epoch"]), "pending": list(state["pending"]),
              "counters": {c: int(state.get("counters", {}).get(c, 0)) for c in COUNTERS},
              "epoch_done": {str(e): int(d) for e, d in state.get("epoch_done", {}).items()}}
        ne = meta.get("num_epochs")
        got = self._run("restore", [*k, NAMES_KEY],
                        [json.dumps(meta), restore_id, json.dumps(st), "" if ne is None else ne, name, _gen(meta)])
        self._gens[name] = _gen(meta)  # the restored queue is the one this worker now works on
        return got == 1

    def drain(self, name: str) -> int:
        k = self._keys(name)
        got = self._run("drain", [k[1], k[2]], [])
        if got == -1:
            raise self._missing(name)
        return int(got)

    def reset(self, name: str) -> bool:
        k = self._keys(name)

        def delete() -> int:
            p = self._r.pipeline(transaction=True)
            p.delete(*k).srem(NAMES_KEY, name)
            return p.execute()[0]
        return self._call("reset", delete) > 0

    def names(self) -> list[str]:
        return sorted(self._call("list", lambda: self._r.smembers(NAMES_KEY)))

    def close(self) -> None:
        try:
            self._r.close()
        except self._errors:
            pass
