"""Transport: the only code that talks to an API server (client, watch, Lease, Events).

The control code sees none of aiohttp: it uses ``transport.Transport`` and the
two failure kinds defined there.
"""
