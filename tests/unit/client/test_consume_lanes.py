"""Consumer streams spread over channels: one HTTP/2 connection carries at most
CONSUME_STREAMS_PER_CHANNEL of them (a broker's stream limit would hold the rest forever)."""

from danube.client.connection import CONSUME_STREAMS_PER_CHANNEL, BrokerConnection


async def test_streams_past_the_per_channel_bound_get_another_channel_and_free_slots_are_reused():
    conn = BrokerConnection("127.0.0.1:1")  # channels connect lazily: nothing listens there
    try:
        lanes = [conn.open_consume_lane() for _ in range(CONSUME_STREAMS_PER_CHANNEL)]
        assert conn.channels == 1 and all(lane.channel is conn.stream_channel for lane in lanes)
        extra = conn.open_consume_lane()
        assert conn.channels == 2 and extra.channel is not conn.stream_channel
        conn.close_consume_lane(lanes[0])
        again = conn.open_consume_lane()  # the first channel has room again
        assert again.channel is conn.stream_channel and conn.channels == 2
    finally:
        await conn.close()
