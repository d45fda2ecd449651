from django.contrib import admin
from django.urls import path

from example_project.demo import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders/", views.create_order),
    path("add/", views.enqueue_add),
    path("jobs/<str:job_id>/", views.job_status),
    path("metrics/", views.metrics),
    path("tenants/", views.tenants, name="tenants"),
    path("tenants/noisy/", views.noisy_tenant, name="noisy-tenant"),
    path("tenants/quiet/", views.quiet_tenant, name="quiet-tenant"),
]
