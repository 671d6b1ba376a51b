package worker

import (
	"net/http"

	"github.com/talkide/talkide/internal/httpapi"
)

// deleteSession ends a conversation and removes it from the worker (see
// harness.Harness.Delete for what is removed). A conversation the worker
// does not have is 404.
func (s *Server) deleteSession(w http.ResponseWriter, r *http.Request) error {
	if s.builds != nil {
		// Builds a restarted worker follows are tied to no CLI process:
		// cancel them (their Jobs deleted) with the conversation.
		s.builds.CancelConversation(r.PathValue("id"))
	}
	res, err := s.h.Delete(r.PathValue("id"))
	if err != nil {
		return mapErr(err)
	}
	httpapi.WriteJSON(w, http.StatusOK, res)
	return nil
}
