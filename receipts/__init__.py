"""callproof receipts: signed, hash-chained, Merkle-checkpointed records of every tool call.

Import from the submodules (receipts.chain, receipts.signing, ...); this package imports nothing
so `callproof verify` stays light. receipts/ never imports runtime/ or gateway/.
"""
