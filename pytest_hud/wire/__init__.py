"""What goes on the wire, without knowing who speaks: the openpi/0 codec (:mod:`.codec`), the
sans-I/O WebSocket core (frames, handshakes, and the one connection state machine both the bridge's
server and the workers' client run) and its blocking client, and JSON-RPC 2.0 (protocol and socket
shells)."""
