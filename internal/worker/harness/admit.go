package harness

import "fmt"

// admitLoadLocked asks Config.AdmitLoad whether one more conversation may be
// loaded (each loaded conversation holds its event log open, and its lease).
// It is called before anything of the load is done, so a refusal leaves
// nothing half-made; the refusal is returned to the caller of the Harness
// method wrapped with ErrUnavailable (errors.As still finds the caller's
// own error type in it). h.mu must be held.
func (h *Harness) admitLoadLocked() error {
	if h.cfg.AdmitLoad == nil {
		return nil
	}
	if err := h.cfg.AdmitLoad(len(h.sessions) + len(h.loading)); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return nil
}
