"""The peer port: its HTTP/1.1 server and client, sessions per peer, streams of frames, warm frame
memory, the loop-lag monitor."""
