"""The channel layer used with Redis (production mode)."""

from channels_redis.core import RedisChannelLayer as _RedisChannelLayer


class RedisChannelLayer(_RedisChannelLayer):
    """channels_redis's layer, polling Redis with a BZPOPMIN shorter than redis-py's read
    timeout. redis-py 8 reads with a 5 s socket timeout by default, as long as channels_redis's
    BZPOPMIN: an empty poll could time out on the client first, raising inside a consumer and
    closing an agent's websocket (seen under load)."""

    brpop_timeout = 2
