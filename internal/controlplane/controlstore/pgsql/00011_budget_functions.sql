-- PostgreSQL only (applied by the Go migration 00011 in pgsql.go; on SQLite
-- the same logic runs in Go inside the budget package's single writer).
--
-- talkide_budget_reserve is the UserBudgetService's pre-call check in one
-- round trip: it locks the user's usage row for the period (SELECT ... FOR
-- UPDATE; for a user never seen in the period, after an INSERT ... ON
-- CONFLICT DO NOTHING, so concurrent first calls serialise too), applies the
-- fair-use window, then
-- reserves p_amount only if spent + reserved + p_amount stays within the
-- limit. Concurrent calls of one user are serialised by the row lock, so
-- admitted spend can never pass the limit.
CREATE OR REPLACE FUNCTION talkide_budget_reserve(
    p_id TEXT, p_ledger_id TEXT, p_user TEXT, p_tenant TEXT, p_env TEXT, p_conversation TEXT,
    p_model TEXT, p_request_id TEXT, p_period TEXT, p_amount BIGINT, p_tokens_estimate BIGINT,
    p_default_limit BIGINT, p_now BIGINT, p_expires BIGINT,
    p_window_ms BIGINT, p_max_requests BIGINT, p_max_tokens BIGINT,
    OUT outcome TEXT, OUT limit_nano BIGINT, OUT committed_nano BIGINT, OUT retry_after_ms BIGINT)
LANGUAGE plpgsql AS $$
DECLARE
    v_spent BIGINT;
    v_reserved BIGINT;
    v_n BIGINT;
    v_tokens BIGINT;
    v_oldest BIGINT;
BEGIN
    retry_after_ms := 0;
    SELECT l.limit_nano INTO limit_nano FROM budget_limits l WHERE l.user_id = p_user;
    IF NOT FOUND THEN
        SELECT t.limit_nano INTO limit_nano FROM budget_tenant_limits t WHERE t.tenant = p_tenant;
        IF NOT FOUND THEN
            limit_nano := p_default_limit;
        END IF;
    END IF;
    SELECT u.spent_nano, u.reserved_nano INTO v_spent, v_reserved
        FROM budget_usage u WHERE u.user_id = p_user AND u.period = p_period FOR UPDATE;
    IF NOT FOUND THEN
        -- A user's first call of the period: concurrent first calls all
        -- insert; the losers wait for the winner's commit, then lock its row.
        INSERT INTO budget_usage (user_id, period) VALUES (p_user, p_period) ON CONFLICT DO NOTHING;
        SELECT u.spent_nano, u.reserved_nano INTO v_spent, v_reserved
            FROM budget_usage u WHERE u.user_id = p_user AND u.period = p_period FOR UPDATE;
    END IF;
    committed_nano := v_spent + v_reserved;
    IF p_window_ms > 0 AND (p_max_requests > 0 OR p_max_tokens > 0) THEN
        SELECT count(*), COALESCE(sum(COALESCE(r.tokens, r.tokens_estimate)), 0), min(r.created_at)
            INTO v_n, v_tokens, v_oldest
            FROM budget_reservations r
            WHERE r.user_id = p_user AND r.created_at > p_now - p_window_ms;
        IF p_max_requests > 0 AND v_n >= p_max_requests THEN
            outcome := 'fair_use_requests';
            retry_after_ms := v_oldest + p_window_ms - p_now;
            RETURN;
        END IF;
        IF p_max_tokens > 0 AND v_tokens >= p_max_tokens THEN
            outcome := 'fair_use_tokens';
            retry_after_ms := v_oldest + p_window_ms - p_now;
            RETURN;
        END IF;
    END IF;
    IF committed_nano + p_amount > limit_nano THEN
        outcome := 'budget';
        RETURN;
    END IF;
    UPDATE budget_usage SET reserved_nano = reserved_nano + p_amount
        WHERE user_id = p_user AND period = p_period;
    INSERT INTO budget_reservations (id, user_id, period, amount_nano, created_at, expires_at, tenant, tokens_estimate)
        VALUES (p_id, p_user, p_period, p_amount, p_now, p_expires, p_tenant, p_tokens_estimate);
    INSERT INTO budget_ledger (id, created_at, kind, user_id, period, reservation_id, conversation_id, model,
            request_id, amount_nano, tenant, env, outcome)
        VALUES (p_ledger_id, p_now, 'reserve', p_user, p_period, p_id, p_conversation, p_model,
            p_request_id, p_amount, p_tenant, p_env, '');
    outcome := 'ok';
END
$$;

-- talkide_budget_settle is postCallDebit: it replaces reservation p_id by
-- the actual cost p_amount. Settling twice books nothing the second time;
-- a reservation that expired (and was charged its worst case) has that
-- charge refunded and the actual cost booked; a reservation this database
-- never saw is booked anyway (a debit is never lost) and recorded as
-- settled. result: settled, already, expired_settled or orphan.
CREATE OR REPLACE FUNCTION talkide_budget_settle(
    p_id TEXT, p_ledger_id TEXT, p_refund_id TEXT, p_user TEXT, p_tenant TEXT, p_env TEXT,
    p_conversation TEXT, p_model TEXT, p_request_id TEXT, p_period TEXT, p_amount BIGINT, p_tokens BIGINT,
    p_input BIGINT, p_output BIGINT, p_cw5m BIGINT, p_cw1h BIGINT, p_cr BIGINT, p_outcome TEXT, p_now BIGINT,
    OUT result TEXT)
LANGUAGE plpgsql AS $$
DECLARE
    v_amount BIGINT;
    v_settled BIGINT;
    v_period TEXT;
    v_user TEXT;
BEGIN
    SELECT r.amount_nano, r.settled_at, r.period, r.user_id INTO v_amount, v_settled, v_period, v_user
        FROM budget_reservations r WHERE r.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO budget_reservations (id, user_id, period, amount_nano, created_at, expires_at, settled_at, tenant, tokens)
            VALUES (p_id, p_user, p_period, 0, p_now, p_now, p_now, p_tenant, p_tokens);
        INSERT INTO budget_usage (user_id, period, spent_nano) VALUES (p_user, p_period, p_amount)
            ON CONFLICT (user_id, period) DO UPDATE SET spent_nano = budget_usage.spent_nano + EXCLUDED.spent_nano;
        v_period := p_period;
        v_user := p_user;
        result := 'orphan';
    ELSIF v_settled IS NOT NULL AND v_settled >= 0 THEN
        result := 'already';
        RETURN;
    ELSIF v_settled IS NULL THEN
        UPDATE budget_usage SET reserved_nano = reserved_nano - v_amount, spent_nano = spent_nano + p_amount
            WHERE user_id = v_user AND period = v_period;
        UPDATE budget_reservations SET settled_at = p_now, tokens = p_tokens WHERE id = p_id;
        result := 'settled';
    ELSE
        UPDATE budget_usage SET spent_nano = spent_nano - v_amount + p_amount
            WHERE user_id = v_user AND period = v_period;
        UPDATE budget_reservations SET settled_at = p_now, tokens = p_tokens WHERE id = p_id;
        INSERT INTO budget_ledger (id, created_at, kind, user_id, period, reservation_id, conversation_id, model,
                request_id, amount_nano, tenant, env, outcome)
            VALUES (p_refund_id, p_now, 'refund', v_user, v_period, p_id, p_conversation, p_model,
                p_request_id, v_amount, p_tenant, p_env, 'expired_charge_replaced');
        result := 'expired_settled';
    END IF;
    INSERT INTO budget_ledger (id, created_at, kind, user_id, period, reservation_id, conversation_id, model,
            request_id, input_tokens, output_tokens, cache_write_5m, cache_write_1h, cache_read, amount_nano,
            tenant, env, outcome)
        VALUES (p_ledger_id, p_now, 'debit', v_user, v_period, p_id, p_conversation, p_model,
            p_request_id, p_input, p_output, p_cw5m, p_cw1h, p_cr, p_amount, p_tenant, p_env, p_outcome);
END
$$;
