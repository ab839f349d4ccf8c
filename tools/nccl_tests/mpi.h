/* A minimal MPI for NVIDIA's nccl-tests, so that they run one process per GPU on machines without
 * an MPI installation: the calls nccl-tests makes, on MPI_COMM_WORLD only, over a Unix-domain socket
 * star around rank 0. Not a general MPI. scripts/nccl_tests_build.sh builds nccl-tests with it
 * (MPI=1 MPI_HOME=<its install>); scripts/nccl_tests_run.sh starts the ranks with
 *   MINI_MPI_RANK, MINI_MPI_SIZE  this process's rank and the number of processes
 *   MINI_MPI_JOB                  a name for the job's socket (random per run)
 * Without them a process is a job of one. Every call fails the process (exit 1 with a message) on
 * an error or after MINI_MPI_TIMEOUT_S (default 300) without its peers. */
#ifndef SYMMEM_MINI_MPI_H_
#define SYMMEM_MINI_MPI_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int MPI_Comm;
typedef int MPI_Datatype;
typedef int MPI_Op;

#define MPI_COMM_WORLD 1
#define MPI_SUCCESS 0
#define MPI_IN_PLACE ((void*)1)

#define MPI_DATATYPE_NULL 0
#define MPI_BYTE 1
#define MPI_CHAR 2
#define MPI_INT 3
#define MPI_LONG 4
#define MPI_LONG_LONG 5
#define MPI_INT64_T 6
#define MPI_UINT64_T 7
#define MPI_DOUBLE 8
#define MPI_FLOAT 9

#define MPI_SUM 1
#define MPI_MIN 2
#define MPI_MAX 3

int MPI_Init(int* argc, char*** argv);
int MPI_Finalize(void);
int MPI_Comm_size(MPI_Comm comm, int* size);
int MPI_Comm_rank(MPI_Comm comm, int* rank);
/* Every rank must pass the same colour (one communicator: the world). */
int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm* out);
int MPI_Comm_free(MPI_Comm* comm);
int MPI_Barrier(MPI_Comm comm);
int MPI_Bcast(void* buffer, int count, MPI_Datatype type, int root, MPI_Comm comm);
int MPI_Allgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount,
                  MPI_Datatype recvtype, MPI_Comm comm);
int MPI_Allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm);
int MPI_Gather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount,
               MPI_Datatype recvtype, int root, MPI_Comm comm);

#ifdef __cplusplus
}
#endif

#endif /* SYMMEM_MINI_MPI_H_ */
