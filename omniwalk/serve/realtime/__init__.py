"""The OpenAI Realtime API over a WebSocket (``GET /v1/realtime``): talk to the model.

route.py         the WebSocket: handshake checks, session limits and lifetime
session.py       one session: client events in order -> handlers -> server events
protocol.py      client events (strict models, GA + beta spellings), server event names per dialect
settings.py      what session.update sets (instructions, voice, modalities, ...), each invalid field refused alone
turn_detection.py server_vad / semantic_vad (eagerness -> silence) settings of the server VAD
conversation.py  items (messages, function calls, their outputs) and the chat messages of a turn's prompt
tools.py         session and response tools / tool_choice: checked, in chat's shape for the engine
bounds.py        what a conversation may hold, and the audio budget all sessions share
input_audio.py   the input audio buffer, cut into turns by the VAD
vad.py           server VAD (WebRTC VAD over 20 ms frames, a vote over a window; turn ends from the last voiced frame)
preemption.py    answers started on a tentative end of turn, released when it is confirmed, else dropped unseen
prompt.py        a response's chat-completions body (settings, response fields, conversation)
response.py      one response: a chat-completions engine request streamed as response events (and calls)
transcription.py the served model transcribes committed user audio (when the session asks)
"""
