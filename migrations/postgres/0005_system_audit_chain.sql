-- The system audit chain: administrative changes that belong to no tenant (admin tokens issued
-- or revoked, master keys rotated, rewrapped or retired) are chained and verified like a
-- tenant's events, under the chain id '@system'. Tenant ids cannot contain '@', so no tenant
-- can ever take it. The reserved row in `tenants` exists only so that the chain's head
-- satisfies its foreign key; the ledger never lists it as a tenant. Like every chain head it
-- exists before the first append (writers lock it), at position 0 with the genesis hash.
-- Existing data is unchanged.
INSERT INTO tenants (id, name, created_at) VALUES ('@system', 'system audit chain', 0)
    ON CONFLICT (id) DO NOTHING;
INSERT INTO audit_heads (tenant, chain_seq, hash)
    VALUES ('@system', 0, '0000000000000000000000000000000000000000000000000000000000000000')
    ON CONFLICT (tenant) DO NOTHING;
