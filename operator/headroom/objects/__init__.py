"""Pure conversion between API objects and ledger terms: no I/O, no asyncio.

Reading Nodes and Reservations (through the total parsers), building status
bodies and patches, decision stamps, NodeHeadroom summaries. Kept apart from the
code that talks to the API so that every byte the operator writes can be tested
without one.
"""
