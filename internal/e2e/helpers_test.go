package e2e

import "github.com/talkide/talkide/internal/devupstream"

func errResponse(status int, typ, msg string) devupstream.Response {
	return devupstream.Response{Error: &devupstream.APIError{Status: status, Type: typ, Message: msg}}
}
