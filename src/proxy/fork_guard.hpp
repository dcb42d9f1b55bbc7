// Closing sockets safely while another thread forks.
//
// A forked child holds a copy of every descriptor of the process until it
// execs (the copies are close-on-exec) or exits. A socket the parent closes
// in that window is not released, so close(2) does not take it out of the
// worker's epoll set, and its next event would name a Leg already freed.
// The control thread forks to start the new binary of an upgrade; without
// a fork, close(2) alone is enough and costs no extra system call.
//
// Protocol (Dekker's, with sequentially consistent atomics): a thread that
// closes a registered socket marks itself closing, then reads whether a
// fork is on; if so it takes the socket out of its epoll set first. The
// forking thread marks the fork on, then waits until no thread is in the
// middle of a close. Either the closer sees the fork (and removes the
// socket) or the fork waits for the close to finish (and copies no
// descriptor of it).
#pragma once

namespace sluice::fork_guard {

// Closing side (a worker thread). True when the caller must take the
// descriptor out of its epoll set before close(2).
bool begin_close();
void end_close();

// Forking side: from begin_fork() to end_fork(), around the fork (and the
// child's exec or exit).
void begin_fork();
void end_fork();

}  // namespace sluice::fork_guard
