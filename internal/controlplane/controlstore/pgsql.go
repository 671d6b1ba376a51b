package controlstore

import (
	"context"
	"database/sql"
	_ "embed"
	"fmt"

	"github.com/pressly/goose/v3"
)

// pgBudgetFunctions are the UserBudgetService's PostgreSQL functions
// (talkide_budget_reserve, talkide_budget_settle).
//
//go:embed pgsql/00011_budget_functions.sql
var pgBudgetFunctions string

// goMigrations are the migrations that differ by dialect. Version 11 creates
// the budget functions on PostgreSQL and is a recorded no-op on SQLite,
// where the budget package runs the same logic in Go.
func goMigrations(d Dialect) []*goose.Migration {
	return []*goose.Migration{
		goose.NewGoMigration(11,
			&goose.GoFunc{RunTx: func(ctx context.Context, tx *sql.Tx) error {
				if d != Postgres {
					return nil
				}
				if _, err := tx.ExecContext(ctx, pgBudgetFunctions); err != nil {
					return fmt.Errorf("create budget functions: %w", err)
				}
				return nil
			}},
			&goose.GoFunc{RunTx: func(ctx context.Context, tx *sql.Tx) error {
				if d != Postgres {
					return nil
				}
				_, err := tx.ExecContext(ctx, `DROP FUNCTION IF EXISTS talkide_budget_settle; DROP FUNCTION IF EXISTS talkide_budget_reserve;`)
				return err
			}},
		),
	}
}
