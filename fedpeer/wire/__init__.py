"""The one gate for untrusted bytes: sessions, the frame, the message schema."""
