package harness

// admitLoadLocked asks Config.AdmitLoad whether one more conversation may be
// loaded (each loaded conversation holds its event log open, and its lease).
// It is called before anything of the load is done, so a refusal leaves
// nothing half-made; the refusal is returned unchanged to the caller of the
// Harness method. h.mu must be held.
func (h *Harness) admitLoadLocked() error {
	if h.cfg.AdmitLoad == nil {
		return nil
	}
	return h.cfg.AdmitLoad(len(h.sessions) + len(h.loading))
}
