"""``python <file>.py args`` as the suite's script server runs it (tests/script_server.py, "The scripts' own
children"): sends the argv, the environment, the working folder and this process's stdin, stdout and stderr to the
stage server, passes on the signals this process gets, and exits as the script did. Standard library only (it runs
with ``-I -S``: an interpreter start, no torch)."""
import json
import os
import signal
import socket
import sys

PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def main():
    sigint = signal.getsignal(signal.SIGINT) is not signal.SIG_IGN     # ignored as inherited (a background job)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(os.environ['SCRIPT_SERVER_SOCKET'])
    except OSError:                     # the server has ended (a socket file left behind): the real interpreter
        python = os.environ['SCRIPT_SERVER_PYTHON']
        os.execv(python, [python, *sys.argv[1:]])
    request = {'argv': sys.argv[1:], 'env': dict(os.environ), 'cwd': os.getcwd(),
               'sigint': sigint}
    socket.send_fds(conn, [(json.dumps(request) + '\n').encode()], [0, 1, 2])

    def pass_on(signum, frame):
        conn.sendall(f'{signum}\n'.encode())

    for signum in PASSED_ON:
        if signum != signal.SIGINT or sigint:
            signal.signal(signum, pass_on)
    answer = b''
    while answer.count(b'\n') < 2:      # the child's pid, then its status
        more = conn.recv(64)
        if not more:
            sys.exit(1)
        answer += more
    code = int(answer.split(b'\n')[1])
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == '__main__':
    main()
