-- The system audit chain: administrative changes that belong to no tenant (admin tokens issued
-- or revoked, master keys rotated, rewrapped or retired) are chained and verified like a
-- tenant's events, under the chain id '@system'. Tenant ids cannot contain '@', so no tenant
-- can ever take it. This reserved row exists only so that the chain's events and head satisfy
-- their foreign keys to `tenants`; the ledger never lists it as a tenant, and nothing else may
-- reference it. Existing data is unchanged.
INSERT INTO tenants (id, name, created_at) VALUES ('@system', 'system audit chain', 0)
    ON CONFLICT (id) DO NOTHING;
