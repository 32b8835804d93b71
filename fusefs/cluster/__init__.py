"""Several daemons as one group: how they find each other (MPI, rendezvous directory, static list),
the authenticated framed TCP protocol between them, the peer server and client, and the running
group that shares files and seeds (a dead or hung node never stops the others).
"""
