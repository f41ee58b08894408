"""Business logic of the sample consumers, beside (not inside) the dedup core.

Each module takes plain inputs (message views, stores) and returns a
settlement decision or a response, so the same code runs under the Functions
host, the delivery simulator and the tests.
"""
