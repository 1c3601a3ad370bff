"""The shop as a FastAPI app with idempo.asgi's middleware."""
import asyncio
import os

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

from idempo.asgi import IdempotencyMiddleware, connect

import common

app = FastAPI()
APP_NAME = os.environ.get('APP_NAME', 'idempo-shop')
if common.POOL_SIZE:
    from psycopg_pool import AsyncConnectionPool
    pool = AsyncConnectionPool(kwargs={'application_name': APP_NAME}, min_size=common.POOL_SIZE,
                               max_size=common.POOL_SIZE, open=False)
    app.add_event_handler('startup', pool.open)
    connection = pool.connection
else:
    connection = connect(application_name=APP_NAME)
app.add_middleware(IdempotencyMiddleware, routes=common.ROUTES, connection=connection)


@app.post('/orders')
async def create_order(request: Request):
    body, conn = await request.json(), request.state.idempo.conn
    if body['customer'] == 'nobody':       # a 4xx the handler decided: stored
        return JSONResponse({'detail': 'no such customer'}, status_code=404)
    if common.lose_connection(body, request.state.idempo.key):
        await conn.execute(common.TERMINATE_SQL)
    cur = await conn.execute(common.ORDER_SQL, common.order_args(body))
    if body['customer'].startswith('flaky'):   # a 5xx after a write: not stored, the write rolled back
        return JSONResponse({'detail': 'try again'}, status_code=503)
    return JSONResponse(common.row(common.ORDER_COLUMNS, await cur.fetchone()), status_code=201,
                        headers={'x-order-handler': 'asgi'})


@app.post('/reservations')
async def reserve(request: Request):
    body, conn = await request.json(), request.state.idempo.conn
    cur = await conn.execute(common.ORDER_SQL, ['reservation', f"line-{body['line']}", 1])
    return JSONResponse({'id': (await cur.fetchone())[0]}, status_code=201)


@app.post('/payments')
async def pay(request: Request):
    body, ctx = await request.json(), request.state.idempo
    try:
        charge = await asyncio.to_thread(common.charge_card, body, ctx.provider_key)
    except Exception:
        slug, title, detail = common.PAYMENT_FAILED
        return JSONResponse({'type': f'{common.DOCS}#{slug}', 'title': title, 'status': 502, 'detail': detail},
                            status_code=502, media_type='application/problem+json')
    await ctx.begin()              # the payment row and complete() commit together
    cur = await ctx.conn.execute(common.PAYMENT_SQL, common.payment_args(body, charge))
    return JSONResponse(common.row(common.PAYMENT_COLUMNS, await cur.fetchone()), status_code=201)


def authenticated(request: Request):
    if 'authorization' not in request.headers:
        raise HTTPException(401, 'log in first')


# the dependency refuses inside the app, where the ASGI middleware cannot see whether the view
# started: its key is left to the lease, as any reply that is not stored
@app.post('/transfers', dependencies=[Depends(authenticated)])
async def transfer(request: Request):
    status, body = common.transfer(await request.json())
    return JSONResponse(body, status_code=status)
